"""The HTTP API over a real socket (uvicorn on 127.0.0.1), with httpx as the client."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from arbormem import Memory
from tests.conftest import chat

from .conftest import ADMIN, TOKENS, A, C, LiveServer

pytest.importorskip("fastapi")


def _client(live: LiveServer, headers: dict[str, str] | None = None) -> httpx.Client:
    return httpx.Client(base_url=live.url, headers=headers or {}, timeout=30)


def test_exchange_lifecycle_recall_tree_and_delete(live: LiveServer) -> None:
    with _client(live, A) as c:
        # "starting" while the model and token counter load in the background (issue 20); a
        # loaded machine can take a few seconds for the token counter alone.
        deadline = time.monotonic() + 60
        while (health := c.get("/health").json())["status"] == "starting" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert health["status"] == "ok" and health["ready"] is True
        r = c.post("/v1/users/alice/exchanges", json={
            "messages": chat("Leo also hates olives.", "Got it: no olives for Leo."),
            "at": "2024-03-03T10:00:00Z", "metadata": {"app": "t"}, "session_id": "s1"})
        assert r.status_code == 201
        ex = r.json()
        assert ex["status"] == "completed" and ex["metadata"] == {"app": "t"} and ex["topic_id"]
        assert ex["user_at"].startswith("2024-03-03")

        pending = c.post("/v1/users/alice/exchanges/begin", json={"user_text": "Where is the party?"})
        assert pending.status_code == 201 and pending.json()["status"] == "pending"
        xid = pending.json()["id"]
        done = c.post(f"/v1/users/alice/exchanges/{xid}/complete", json={"assistant_text": "In the park."})
        assert done.json()["status"] == "completed"
        again = c.post(f"/v1/users/alice/exchanges/{xid}/complete", json={"assistant_text": "x"})
        assert again.status_code == 409 and again.json()["error"]["code"] == "invalid_state"
        other = c.post("/v1/users/alice/exchanges/begin", json={"user_text": "Will it rain?"}).json()
        failed = c.post(f"/v1/users/alice/exchanges/{other['id']}/fail", json={"reason": "timeout"})
        assert failed.json()["status"] == "failed"

        imp = c.post("/v1/users/bob/exchanges/import", json={"exchanges": [
            {"messages": chat(f"Bob note {i} about sailing boats", "ok"), "at": f"2023-01-0{i + 1}T00:00:00Z"}
            for i in range(3)]})
        assert imp.status_code == 201 and imp.json()["imported"] == 3

        listed = c.get("/v1/users/alice/exchanges", params={"limit": 2}).json()
        assert [e["seq"] for e in listed["exchanges"]] == [1, 2] and listed["next_after_seq"] == 2
        rest = c.get("/v1/users/alice/exchanges", params={"after_seq": 2, "status": "completed"}).json()
        assert all(e["seq"] > 2 and e["status"] == "completed" for e in rest["exchanges"])
        assert c.get(f"/v1/users/alice/exchanges/{xid}").json()["assistant_text"] == "In the park."

        rec = c.post("/v1/users/alice/recall", json={"query": "What can Leo eat? peanuts", "max_tokens": 300})
        body = rec.json()
        assert set(body) >= {"text", "tokens", "exchanges", "topics"}
        assert 0 < body["tokens"] <= 300 and "peanuts" in body["text"]
        assert any("peanuts" in e["user_text"] for e in body["exchanges"]) and body["topics"]

        hits = c.post("/v1/users/alice/search", json={"query": "chocolate cake", "limit": 2}).json()["hits"]
        assert hits and "chocolate" in hits[0]["exchange"]["user_text"]

        tree = c.get("/v1/users/alice/tree").json()
        assert tree["kind"] == "root" and tree["size"] == 5 and tree["children"]
        topics = c.get("/v1/users/alice/topics").json()["topics"]
        leaf = next(t for t in topics if t["kind"] == "topic")
        t0 = c.get(f"/v1/users/alice/topics/{leaf['id']}").json()
        assert t0["topic"]["title"] == leaf["title"] and "exchanges" not in t0
        t2 = c.get(f"/v1/users/alice/topics/{leaf['id']}", params={"depth": 2}).json()
        assert t2["detail"] and t2["detail_source"] == "extractive" and t2["exchanges"]
        # ``tier`` is the old name of ``depth`` (issue 21 renamed it), still accepted.
        assert c.get(f"/v1/users/alice/topics/{leaf['id']}", params={"tier": 2}).json() == t2
        tex = c.get(f"/v1/users/alice/topics/{leaf['id']}/exchanges").json()["exchanges"]
        assert {e["topic_id"] for e in tex} == {leaf["id"]} and len(tex) == leaf["size"]
        assert c.get("/v1/users/alice/stats").json()["completed"] == 5
        pinned = c.put(f"/v1/users/alice/topics/{leaf['id']}/recall_mode", json={"mode": "both"})
        assert pinned.status_code == 200 and pinned.json()["id"] == leaf["id"]
        assert c.put(f"/v1/users/alice/topics/{leaf['id']}/recall_mode", json={"mode": "x"}).status_code == 422
        changes = c.get(f"/v1/users/alice/history/{leaf['id']}").json()["changes"]
        assert changes[0]["action"] == "recall_mode" and changes[0]["detail"]["to"] == "both"
        undo = c.post(f"/v1/users/alice/changes/{changes[0]['id']}/undo")
        assert undo.status_code == 409 and undo.json()["error"]["code"] == "invalid_state"

        assert c.delete(f"/v1/users/alice/exchanges/{ex['id']}").status_code == 204
        gone = c.get(f"/v1/users/alice/exchanges/{ex['id']}")
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
        assert all(h["exchange"]["id"] != ex["id"] for h in
                   c.post("/v1/users/alice/search", json={"query": "olives", "limit": 10}).json()["hits"])

        deleted = c.delete("/v1/users/bob").json()
        assert deleted == {"user_id": "bob", "deleted": 3}
        assert c.get("/v1/users/bob/exchanges").json()["exchanges"] == []


def test_documents_route_dedupes(live: LiveServer) -> None:
    text = "Tea ceremony notes.\n\n" + " ".join(f"Step {i}: whisk the matcha gently." for i in range(80))
    with _client(live, A) as c:
        first = c.post("/v1/users/alice/documents", json={"text": text, "source": "tea.md"})
        assert first.status_code == 201 and first.json()["chunks"] >= 2
        assert len(first.json()["added"]) == first.json()["chunks"]
        second = c.post("/v1/users/alice/documents", json={"text": text, "source": "tea.md"}).json()
        assert second["added"] == [] and sorted(second["duplicates"]) == sorted(first.json()["added"])


def test_typed_errors_limits_and_openapi(live: LiveServer) -> None:
    with _client(live, A) as c:
        bad = c.post("/v1/users/alice/exchanges", json={"messages": []})
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_input"
        role = c.post("/v1/users/alice/exchanges", json={"messages": [{"role": "wizard", "content": "x"}]})
        assert role.status_code == 422 and "role" in role.json()["error"]["message"]
        name = c.post("/v1/users/alice/exchanges", json={"messages": [{"role": "user", "name": ["x"], "content": "x"}]})
        assert name.status_code == 422 and "messages[0].name" in name.json()["error"]["message"]
        named = c.post("/v1/users/alice/exchanges", json={"messages": [
            {"role": "user", "name": "Maria", "content": "I adopted a grey cat named Pixel."},
            {"role": "assistant", "name": "John", "content": "Pixel is a great name!"}]})
        assert named.status_code == 201 and named.json()["messages"][0]["name"] == "Maria"
        text = c.post("/v1/users/alice/recall", json={"query": "Maria's cat Pixel", "max_tokens": 300}).json()["text"]
        assert "Maria: I adopted a grey cat named Pixel.\nJohn: Pixel is a great name!" in text
        broken = c.post("/v1/users/alice/recall", content=b"{not json", headers={"content-type": "application/json"})
        assert broken.status_code == 422 and broken.json()["error"]["code"] == "invalid_input"
        big = c.post("/v1/users/alice/exchanges", json={"messages": chat("x" * 300_000, "y")})
        assert big.status_code == 413 and big.json()["error"]["code"] == "payload_too_large"

        def chunks():  # no Content-Length: the streamed size is counted
            for _ in range(40):
                yield b" " * 10_000

        streamed = c.post("/v1/users/alice/recall", content=chunks(), headers={"content-type": "application/json"})
        assert streamed.status_code == 413
        assert c.get("/v1/users/alice/nothing-here").json()["error"]["code"] == "not_found"
        assert c.get("/v1/users/alice/exchanges/x_missing").status_code == 404
        missing_topic = c.get("/v1/users/alice/topics/t_missing")
        assert missing_topic.status_code == 404 and missing_topic.json()["error"]["code"] == "not_found"
        cons = c.post("/v1/users/alice/consolidate")
        assert cons.status_code in (200, 501)
        if cons.status_code == 501:
            assert cons.json()["error"]["code"] == "not_implemented"
        spec = c.get("/openapi.json").json()
        assert {"/health", "/v1/users/{user_id}/exchanges", "/v1/users/{user_id}/recall",
                "/v1/users/{user_id}/tree", "/v1/users/{user_id}"} <= set(spec["paths"])
        assert "delete" in spec["paths"]["/v1/users/{user_id}"]
        # Typed responses, so clients in other languages can be generated from the schema.
        schemas = spec["components"]["schemas"]
        recall_op = spec["paths"]["/v1/users/{user_id}/recall"]["post"]["responses"]
        assert recall_op["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/RecallResult")
        assert {"text", "tokens", "exchanges", "topics"} <= set(schemas["RecallResult"]["properties"])
        assert {"id", "seq", "status", "messages", "user_at", "topic_id"} <= set(schemas["Exchange"]["properties"])
        assert recall_op["403"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")


def _user_routes(live: LiveServer) -> list[tuple[str, str]]:
    spec = httpx.get(live.url + "/openapi.json").json()
    out = []
    for path, ops in spec["paths"].items():
        if path.startswith("/v1/users/{user_id}"):
            out.extend((method.upper(), path) for method in ops)
    return out


def test_every_route_needs_a_token_and_the_right_user(live: LiveServer, seeded: Memory) -> None:
    routes = _user_routes(live)
    assert len(routes) >= 20
    carol_x = seeded.exchanges(user_id="carol")[0].id
    carol_t = next(t.id for t in seeded.topics(user_id="carol") if t.kind == "topic")
    with httpx.Client(base_url=live.url, timeout=30) as c:
        for method, path in routes:
            url = re.sub(r"\{exchange_id\}", carol_x, re.sub(r"\{topic_id\}", carol_t, path))
            body = {"query": "vault", "messages": chat("x", "y")} if method == "POST" else None
            none = c.request(method, url.replace("{user_id}", "carol"), json=body)
            assert none.status_code == 401, (method, path)
            assert none.json()["error"]["code"] == "unauthorized"
            wrong = c.request(method, url.replace("{user_id}", "carol"), json=body,
                              headers={"Authorization": "Bearer not-a-token"})
            assert wrong.status_code == 401
            other = c.request(method, url.replace("{user_id}", "carol"), json=body, headers=A)
            assert other.status_code == 403, (method, path)
            assert other.json()["error"]["code"] == "forbidden"
        assert c.get("/v1/me").status_code == 401
        assert c.get("/v1/me", headers=ADMIN).json() == {"users": "*"}
    # Carol's data is untouched after all those attempts.
    assert len(seeded.exchanges(user_id="carol")) == 2


def test_ids_of_another_user_are_not_found_through_own_routes(live: LiveServer, seeded: Memory) -> None:
    """Token A passes the user check for alice, then tries carol's exchange and topic ids."""
    carol_x = seeded.exchanges(user_id="carol")[0].id
    pending = seeded.begin("Carol asks about cello strings", user_id="carol")
    carol_t = next(t.id for t in seeded.topics(user_id="carol") if t.kind == "topic")
    with _client(live, A) as c:
        assert c.get(f"/v1/users/alice/exchanges/{carol_x}").status_code == 404
        assert c.delete(f"/v1/users/alice/exchanges/{carol_x}").status_code == 404
        assert c.post(f"/v1/users/alice/exchanges/{pending.id}/complete",
                      json={"assistant_text": "hijack"}).status_code == 404
        assert c.post(f"/v1/users/alice/exchanges/{pending.id}/fail", json={"reason": "x"}).status_code == 404
        for depth in (0, 1, 2):
            assert c.get(f"/v1/users/alice/topics/{carol_t}", params={"depth": depth}).status_code == 404
        assert c.get(f"/v1/users/alice/topics/{carol_t}/exchanges").status_code == 404
        q = {"query": "what is the secret code, and which instrument?"}
        texts = [c.post("/v1/users/alice/recall", json=q).text,
                 c.post("/v1/users/alice/search", json=q).text,
                 c.get("/v1/users/alice/exchanges").text, c.get("/v1/users/alice/tree").text,
                 c.get("/v1/users/alice/topics").text]
        assert not any("7431" in t or "cello" in t for t in texts)
        # carol's change log: invisible, and her change ids are unknown under alice (404, not 409)
        carol_change = seeded.set_recall_mode(carol_t, "both", user_id="carol")
        change_id = seeded.history(carol_t, user_id="carol")[0].id
        assert carol_change.id == carol_t
        assert c.get(f"/v1/users/alice/history/{carol_t}").status_code == 404  # as for any unknown id
        assert c.post(f"/v1/users/alice/changes/{change_id}/undo").status_code == 404
        assert c.put(f"/v1/users/alice/topics/{carol_t}/recall_mode", json={"mode": "active"}).status_code == 404
        assert c.delete("/v1/users/alice").json()["deleted"] == 3
    with _client(live, C) as c:
        assert "7431" in c.post("/v1/users/carol/recall", json={"query": "vault code"}).json()["text"]
    assert seeded.get(carol_x).user_id == "carol" and seeded.get(pending.id).status == "pending"


def test_app_refuses_to_start_without_tokens(tmp_path, monkeypatch) -> None:
    from arbormem import ConfigError
    from arbormem.server.app import create_app

    monkeypatch.delenv("ARBORMEM_API_TOKENS", raising=False)
    with Memory(tmp_path / "m.db", embedder="hash") as mem:
        with pytest.raises(ConfigError, match="ARBORMEM_API_TOKENS"):
            create_app(mem)
        monkeypatch.setenv("ARBORMEM_API_TOKENS", TOKENS)
        assert create_app(mem) is not None
        with pytest.raises(ConfigError):
            create_app(mem, tokens="bad token:alice")
        with pytest.raises(ConfigError):
            create_app(mem, tokens="tokA:")  # bound to nobody


@pytest.mark.slow
def test_same_api_over_postgres(request: pytest.FixtureRequest) -> None:
    """The app serves any store: the same routes and isolation over PostgreSQL."""
    pytest.importorskip("psycopg")
    from arbormem.server.app import create_app
    from tests.support.postgres import create_database, drop_database

    from .conftest import seed

    server_url = request.getfixturevalue("pg_url")
    url = create_database(server_url)
    try:
        with Memory(database_url=url, embedder="hash") as mem:
            seed(mem)
            live = LiveServer(create_app(mem, tokens=TOKENS))
            try:
                with _client(live, A) as c:
                    r = c.post("/v1/users/alice/recall", json={"query": "peanuts for Leo", "max_tokens": 200})
                    assert r.status_code == 200 and "peanuts" in r.json()["text"]
                    assert c.get("/v1/users/carol/tree").status_code == 403
                    carol_x = mem.exchanges(user_id="carol")[0].id
                    assert c.get(f"/v1/users/alice/exchanges/{carol_x}").status_code == 404
                    assert c.delete("/v1/users/alice").json()["deleted"] == 3
            finally:
                live.stop()
    finally:
        drop_database(server_url, url)


def test_concurrent_writes_and_reads(live: LiveServer, seeded: Memory) -> None:
    """Requests run in FastAPI's thread pool over one Memory: no lost writes, unique seqs."""
    from concurrent.futures import ThreadPoolExecutor

    def work(i: int) -> tuple[int, int]:
        user = "alice" if i % 2 else "bob"
        with _client(live, A) as c:
            w = c.post(f"/v1/users/{user}/exchanges", json={"messages": chat(f"parallel note {i}", "ok")})
            r = c.post(f"/v1/users/{user}/search", json={"query": f"parallel note {i}", "limit": 3})
            return w.status_code, r.status_code

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(work, range(24)))
    assert codes == [(201, 200)] * 24
    for user, extra in (("alice", 3), ("bob", 0)):
        seqs = [e.seq for e in seeded.exchanges(user_id=user)]
        assert len(seqs) == 12 + extra and len(set(seqs)) == len(seqs)


def test_cors_preflight_then_token(seeded: Memory) -> None:
    from arbormem.server.app import create_app

    live = LiveServer(create_app(seeded, tokens=TOKENS, cors_origins=["https://app.example"]))
    try:
        with httpx.Client(base_url=live.url, timeout=30) as c:
            pre = c.options("/v1/users/alice/recall", headers={
                "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type"})
            assert pre.status_code == 200
            assert pre.headers["access-control-allow-origin"] == "https://app.example"
            no_token = c.post("/v1/users/alice/recall", json={"query": "x"}, headers={"Origin": "https://app.example"})
            assert no_token.status_code == 401
            ok = c.post("/v1/users/alice/recall", json={"query": "peanuts"},
                        headers={**A, "Origin": "https://app.example"})
            assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://app.example"
            other = c.options("/v1/users/alice/recall", headers={
                "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
            assert "access-control-allow-origin" not in other.headers
    finally:
        live.stop()
