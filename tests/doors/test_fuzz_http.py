"""Every HTTP route, fuzzed over a real socket (issue 19): any path, query and body gives a 2xx,
or a 4xx whose body is the error shape ``{"error": {"code", "message"}}``; never a 5xx, and
after any accepted request the users' recall, search and stats still answer 200.

Routes are read off the app (a new route without a body strategy here fails
``test_every_route_is_fuzzed``); path parameters are ids that exist, ids that do not, and
hostile text (sent as raw bytes, lone surrogates as invalid UTF-8); bodies are plausible JSON,
hostile JSON (NaN, far dates, surrogates, deep nesting, wrong types) or not JSON at all."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arbormem import Memory

from .conftest import TOKENS, LiveServer, seed

pytest.importorskip("fastapi")

ADMIN = {"Authorization": "Bearer tok-admin-1"}
USERS = ("alice", "carol")

nasty = st.lists(st.one_of(
    st.characters(codec=None, exclude_categories=()),
    st.sampled_from(["\x00", "\u2028", "\n## Travel\nassistant: x", "<|endoftext|>", "</memory-context>", "cello",
                     "7431", "31 December 9999", "5000 years ago", "assistant", "_arbormem", "..", "/", "%", "?"]),
), max_size=8).map("".join)
leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.sampled_from([10**30, -(2**63), 2**63]),
                 st.floats(allow_nan=True, allow_infinity=True), nasty)
value = st.recursive(leaf, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                  st.dictionaries(nasty, kids, max_size=3)), max_leaves=8)
times = st.one_of(st.sampled_from(["2024-03-02T10:00:00Z", "9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00Z",
                                   "9999-12-29T23:59:59+00:00", "yesterday", "2024-02-30T00:00:00Z"]),
                  st.integers(), value)
message = st.one_of(st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["user", "assistant", "system", "tool"]), value),
     "content": st.one_of(nasty, st.sampled_from(["cello practice", "the vault code"]), value)},
    optional={"name": st.one_of(st.sampled_from(["Maria", "assistant", "A\u2028B"]), value), "extra": value}), value)
messages = st.one_of(st.lists(message, min_size=1, max_size=3).map(
    lambda ms: [{"role": "user", "content": "cello practice plan"}, *ms]), st.lists(message, max_size=3), value)
exchange = st.fixed_dictionaries({"messages": messages}, optional={
    "at": times, "assistant_at": times, "metadata": st.one_of(st.dictionaries(nasty, value, max_size=3), value),
    "session_id": st.one_of(nasty, value)})
counts = st.one_of(st.integers(-2, 2000), st.booleans(), st.floats(allow_nan=True), st.sampled_from([10**20]), nasty)
query = st.one_of(st.sampled_from(["cello", "the vault code 7431", "31 December 9999", "99999999999 days ago"]),
                  nasty, value)

BODIES: dict[str, st.SearchStrategy[Any]] = {
    "POST /v1/users/{user_id}/exchanges": exchange,
    "POST /v1/users/{user_id}/exchanges/begin": st.fixed_dictionaries(
        {"user_text": st.one_of(query, st.just("cello question"))},
        optional={"at": times, "metadata": value, "session_id": value}),
    "POST /v1/users/{user_id}/exchanges/import": st.fixed_dictionaries(
        {"exchanges": st.one_of(st.lists(exchange, max_size=3), value)}),
    "POST /v1/users/{user_id}/exchanges/{exchange_id}/complete": st.fixed_dictionaries(
        {"assistant_text": query}, optional={"at": times}),
    "POST /v1/users/{user_id}/exchanges/{exchange_id}/fail": st.fixed_dictionaries({"reason": query}),
    "POST /v1/users/{user_id}/documents": st.fixed_dictionaries(
        {"text": st.one_of(query, st.just("Cello notes.\n\nBow hold and rosin.")), "source": query},
        optional={"at": times, "metadata": value}),
    "POST /v1/users/{user_id}/recall": st.fixed_dictionaries(
        {"query": query}, optional={"max_tokens": counts, "recent": counts}),
    "POST /v1/users/{user_id}/search": st.fixed_dictionaries({"query": query}, optional={"limit": counts}),
    "PUT /v1/users/{user_id}/topics/{topic_id}/recall_mode": st.fixed_dictionaries(
        {"mode": st.one_of(st.sampled_from(["active", "passive", "both"]), value)}),
    "POST /v1/users/{user_id}/changes/{change_id}/undo": st.none(),
    "POST /v1/users/{user_id}/consolidate": st.none(),
}
QUERIES = st.dictionaries(st.sampled_from(["limit", "after_seq", "status", "depth", "confirm", "expect_exchanges", "x"]),
                          st.one_of(st.integers(-5, 2000).map(str), st.sampled_from(["true", "1e3", "10" * 12, "",
                                                                                    "completed", "2", "false"]), nasty),
                          max_size=3)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Memory, LiveServer]]:
    from arbormem.server.app import create_app

    with Memory(tmp_path_factory.mktemp("fuzzhttp") / "m.db", embedder="hash") as mem:
        seed(mem)
        srv = LiveServer(create_app(mem, tokens=TOKENS, max_body_bytes=256 * 1024))
        yield mem, srv
        srv.stop()


def _routes() -> list[tuple[str, str]]:
    from arbormem.server.app import create_app

    with Memory(":memory:", embedder="hash") as mem:
        schema = create_app(mem, allow_anonymous=True).openapi()
    return sorted((method.upper(), path) for path, ops in schema["paths"].items() if path.startswith("/v1/")
                  for method in ops)


ROUTES = _routes()


def test_every_route_is_fuzzed() -> None:
    assert len(ROUTES) >= 20
    for method, path in ROUTES:
        if method in ("POST", "PUT"):
            assert f"{method} {path}" in BODIES, f"no body strategy for {method} {path}"


def _segment(text: str) -> str:
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


def _shape(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        assert r.headers.get("content-type", "").startswith("application/json"), r.text[:200]
        err = r.json()["error"]
        assert isinstance(err["code"], str) and isinstance(err["message"], str)


def _reads_work(c: httpx.Client) -> None:
    for u in USERS:
        for q in ("cello", "what did we say today", "in December"):
            assert c.post(f"/v1/users/{u}/recall", json={"query": q, "max_tokens": 300}).status_code == 200
            assert c.post(f"/v1/users/{u}/search", json={"query": q}).status_code == 200
        assert c.get(f"/v1/users/{u}/stats").status_code == 200


def _ids(mem: Memory, kind: str, user: str) -> list[str]:
    if kind == "exchange_id":
        return [e.id for e in mem.exchanges(user_id=user)][:20]
    if kind in ("topic_id", "item_id"):
        return [t.id for t in mem.topics(user_id=user)][:20]
    return [c.id for t in mem.topics(user_id=user)[:3] for c in mem.history(t.id, user_id=user)]


class _Known:
    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<stored id #{self.index}>"


@settings(max_examples=int(os.environ.get("ARBORMEM_FUZZ_EXAMPLES", "150")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_any_request_is_2xx_or_a_shaped_4xx(server: tuple[Memory, LiveServer], data: st.DataObject) -> None:
    mem, srv = server
    method, template = data.draw(st.sampled_from(ROUTES), label="route")
    user = data.draw(st.one_of(st.sampled_from(USERS), nasty), label="user")
    path = template
    for name in re.findall(r"{(\w+)}", template):
        if name == "user_id":
            seg = user
        else:
            pick = data.draw(st.one_of(st.integers(0, 999).map(_Known), nasty), label=name)
            if isinstance(pick, _Known):
                known = _ids(mem, name, user) if user in USERS else []
                pick = known[pick.index % len(known)] if known else "x_missing"
            seg = pick
        path = path.replace("{" + name + "}", _segment(seg) or "%20")
    params = data.draw(QUERIES, label="query") if method in ("GET", "DELETE") else {}
    kwargs: dict[str, Any] = {"params": {k: v.encode("utf-8", "surrogatepass") for k, v in params.items()}}
    if method in ("POST", "PUT"):
        kind = data.draw(st.sampled_from(["json", "json", "json", "raw"]), label="body kind")
        if kind == "json":
            body = data.draw(BODIES[f"{method} {template}"], label="body")
            raw = json.dumps(body, allow_nan=True, ensure_ascii=data.draw(st.booleans(), label="ascii"))
            kwargs["content"] = raw.encode("utf-8", "surrogatepass")
        else:
            kwargs["content"] = data.draw(st.one_of(st.binary(max_size=64), st.sampled_from(
                [b"[" * 5000, b'{"query": "x"', b"\xff\xfe", b"null", b"{}"])), label="raw body")
        kwargs["headers"] = {"content-type": "application/json"}
    with httpx.Client(base_url=srv.url, headers=ADMIN, timeout=30) as c:
        r = c.request(method, path, **kwargs)
        _shape(r)
        if r.status_code < 300 and method != "GET":
            _reads_work(c)


def test_nan_and_far_times_never_land(server: tuple[Memory, LiveServer]) -> None:
    _, srv = server
    with httpx.Client(base_url=srv.url, headers=ADMIN, timeout=30) as c:
        body = json.dumps({"messages": [{"role": "user", "content": "x"}], "metadata": {"v": math.nan}})
        r = c.post("/v1/users/alice/exchanges", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422
        _reads_work(c)
