"""Forgetting a topic or theme through the doors: the HTTP API over a real socket and the MCP
server over a real stdio subprocess. A theme of several topics is refused without an explicit
confirmation (the refusal carries the counts), and exactly the previewed exchanges go."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from arbormem import Memory, Topic
from arbormem.check import check

from .conftest import TOKENS, A, C, LiveServer, seed

pytest.importorskip("fastapi")


def _leaves(node: Topic) -> set[str]:
    return {t.id for t in node.walk() if t.kind == "topic"}


def _theme(mem: Memory, user: str = "alice") -> Topic:
    return next(t for t in mem.tree(user_id=user).walk() if t.kind == "theme" and len(_leaves(t)) > 1)


def _filed_under(mem: Memory, node: Topic, user: str = "alice") -> list[str]:
    leaves = _leaves(node)
    return [e.id for e in mem.exchanges(user_id=user) if e.topic_id in leaves]


def _fill(mem: Memory, demo: dict[str, Any]) -> None:
    seed(mem)  # alice's party and Leo, carol's vault code and cello
    mem.add_many(demo["exchanges"], user_id="alice")


@pytest.fixture
def filled(tmp_path: Path, demo_data: dict[str, Any]) -> Iterator[Memory]:
    with Memory(tmp_path / "forget.db", embedder="hash") as mem:
        _fill(mem, demo_data)
        yield mem


@pytest.fixture
def live(filled: Memory) -> Iterator[LiveServer]:
    from arbormem.server.app import create_app

    server = LiveServer(create_app(filled, tokens=TOKENS))
    yield server
    server.stop()


def test_http_previews_refuses_a_theme_without_confirm_and_reports_what_went(
        live: LiveServer, filled: Memory) -> None:
    theme = _theme(filled)
    doomed = _filed_under(filled, theme)
    everything = [e.id for e in filled.exchanges(user_id="alice")]
    carol = [e.id for e in filled.exchanges(user_id="carol")]
    base = f"/v1/users/alice/topics/{theme.id}"
    with httpx.Client(base_url=live.url, headers=A, timeout=30) as c:
        preview = c.get(base + "/forget")
        assert preview.status_code == 200, preview.text
        p = preview.json()
        assert p["exchange_ids"] == doomed and p["exchange_count"] == len(doomed)
        assert p["topic_count"] == len(_leaves(theme)) and p["confirm_required"] is True
        assert p["applied"] is False and p["kind"] == "theme" and p["path"] == list(theme.path)

        refused = c.delete(base)
        assert refused.status_code == 409
        err = refused.json()["error"]
        assert err["code"] == "confirmation_required" and "confirm=true" in err["message"]
        assert f"{len(doomed)} exchanges in {len(_leaves(theme))} topics" in err["message"]
        assert err["preview"]["exchange_ids"] == doomed and err["preview"]["exchange_count"] == len(doomed)
        assert c.delete(base, params={"confirm": "false"}).status_code == 409
        stale = c.delete(base, params={"confirm": "true", "expect_exchanges": len(doomed) + 1})
        assert stale.status_code == 409 and stale.json()["error"]["code"] == "invalid_state"
        assert c.delete(base, params={"confirm": "true", "expect_exchanges": -1}).status_code == 422
        assert [e.id for e in filled.exchanges(user_id="alice")] == everything  # nothing went yet

        # Scoping: another user's token, another user's topic under alice's path, no token.
        assert c.delete(f"/v1/users/carol/topics/{theme.id}", params={"confirm": "true"}).status_code == 403
        carol_topic = next(t.id for t in filled.topics(user_id="carol"))
        for resp in (c.get(f"/v1/users/alice/topics/{carol_topic}/forget"),
                     c.delete(f"/v1/users/alice/topics/{carol_topic}", params={"confirm": "true"})):
            assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
        assert httpx.delete(live.url + base, params={"confirm": "true"}).status_code == 401

        done = c.delete(base, params={"confirm": "true", "expect_exchanges": len(doomed)})
        assert done.status_code == 200, done.text
        d = done.json()
        assert d["applied"] is True and d["exchange_ids"] == doomed
        assert d["removed_topic_ids"] == p["removed_topic_ids"]
        assert c.get(base + "/forget").status_code == 404
        listed = c.get("/v1/users/alice/exchanges", params={"limit": 1000}).json()["exchanges"]
        assert [e["id"] for e in listed] == [x for x in everything if x not in doomed]

        # One topic (not a theme) goes without a confirmation.
        leaf = next(t for t in filled.topics(user_id="alice") if t.kind == "topic")
        mine = _filed_under(filled, leaf)
        single = c.delete(f"/v1/users/alice/topics/{leaf.id}")
        assert single.status_code == 200 and single.json()["exchange_ids"] == mine
    with httpx.Client(base_url=live.url, headers=C, timeout=30) as c:
        assert [e["id"] for e in c.get("/v1/users/carol/exchanges").json()["exchanges"]] == carol
    assert check(filled).ok


def test_mcp_forget_answers_a_preview_for_a_theme_until_confirmed(tmp_path: Path, demo_data: dict[str, Any]) -> None:
    pytest.importorskip("mcp")
    from mcp import Client

    from .test_mcp import _data, _error, _params

    db = tmp_path / "mcp.db"
    with Memory(db, embedder="hash") as mem:
        _fill(mem, demo_data)
        theme = _theme(mem)
        doomed = _filed_under(mem, theme)
        everything = [e.id for e in mem.exchanges(user_id="alice")]
        carol = [e.id for e in mem.exchanges(user_id="carol")]
        carol_topic = next(t.id for t in mem.topics(user_id="carol"))

    async def main() -> None:
        async with Client(_params(db, "alice"), read_timeout_seconds=60) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert "confirm" in tools["forget"].input_schema["properties"]
            first = _data(await client.call_tool("forget", {"topic_id": theme.id}))
            assert first["deleted"] == [] and first["confirmation_required"] is True
            assert first["preview"]["exchange_ids"] == doomed and first["preview"]["applied"] is False
            assert first["preview"]["exchanges"] == len(doomed)
            assert f"{len(doomed)} exchanges" in first["message"]
            assert "not_found" in _error(await client.call_tool("forget", {"topic_id": carol_topic, "confirm": True}))
            assert "invalid_input" in _error(await client.call_tool(
                "forget", {"exchange_id": everything[0], "confirm": True}))
            gone = _data(await client.call_tool("forget", {"topic_id": theme.id, "confirm": True}))
            assert gone["deleted"] == doomed and gone["topic"]["applied"] is True
            assert theme.id in gone["topic"]["removed_topic_ids"]

    anyio.run(main)
    with Memory(db, embedder="hash") as mem:
        assert [e.id for e in mem.exchanges(user_id="alice")] == [x for x in everything if x not in doomed]
        assert [e.id for e in mem.exchanges(user_id="carol")] == carol
        assert check(mem).ok
