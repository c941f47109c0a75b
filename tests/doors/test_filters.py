"""Filters and the relevance floor through the doors (issue 18): HTTP, MCP and the CLI.

The memory uses the hash embedder, which has no calibrated floor, so these set one where
they test it; the filters are the library's (tests/store/test_filters.py covers both stores).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from click.testing import CliRunner

from arbormem import Memory
from tests.conftest import chat

from .conftest import A, LiveServer

ITEMS = [
    {"messages": chat("The boiler code is 4471.", "Noted, boiler code 4471."), "session_id": "home",
     "at": "2024-05-01T08:00:00Z", "metadata": {"room": "cellar", "floor": 0}},
    {"messages": chat("The boiler service is in June.", "June it is, for the boiler."), "session_id": "home",
     "at": "2024-05-20T08:00:00Z", "metadata": {"room": "cellar", "floor": 0}},
    {"messages": chat("At work the boiler of the canteen broke.", "Poor canteen boiler."), "session_id": "work",
     "at": "2024-05-21T08:00:00Z", "metadata": {"room": "canteen", "floor": 1}},
]

FILTERS: list[tuple[dict[str, Any], set[str]]] = [
    ({"session_id": "home"}, {"home"}),
    ({"session_id": "work"}, {"work"}),
    ({"since": "2024-05-10T00:00:00Z"}, {"home", "work"}),
    ({"until": "2024-05-10T00:00:00Z"}, {"home"}),
    ({"metadata": {"room": "canteen"}}, {"work"}),
    ({"metadata": {"floor": 0}}, {"home"}),
    ({"session_id": "nope"}, set()),                      # matches nothing
    ({"metadata": {"room": "attic"}}, set()),
]


def _sessions(exchanges: list[dict[str, Any]]) -> set[str]:
    return {e["session_id"] for e in exchanges}


def test_http_filters_and_floor(seeded: Memory, live: LiveServer) -> None:
    pytest.importorskip("fastapi")
    seeded.add_many(ITEMS, user_id="bob")
    with httpx.Client(base_url=live.url, headers=A, timeout=30) as c:
        for flt, sessions in FILTERS:
            hits = c.post("/v1/users/bob/search", json={"query": "boiler", "limit": 10, **flt})
            assert hits.status_code == 200, hits.text
            assert _sessions([h["exchange"] for h in hits.json()["hits"]]) == sessions, flt
            rec = c.post("/v1/users/bob/recall", json={"query": "boiler", "max_tokens": 500, **flt})
            assert rec.status_code == 200, rec.text
            assert _sessions(rec.json()["exchanges"]) == sessions, flt
            assert "stopped" in rec.json()["trace"]
        assert c.post("/v1/users/bob/search", json={"query": "zzzqqq", "min_relevance": 0.3}).json()["hits"] == []
        rec = c.post("/v1/users/bob/recall", json={"query": "zzzqqq", "min_relevance": 0.3}).json()
        assert rec["trace"]["stopped"].startswith("relevance floor") and rec["trace"]["min_relevance"] == 0.3
        bad = [{"metadata": {"room": ["a"]}}, {"since": "yesterday"}, {"min_relevance": -1},
               {"since": "2024-06-01T00:00:00Z", "until": "2024-05-01T00:00:00Z"}]
        for b in bad:
            assert c.post("/v1/users/bob/search", json={"query": "boiler", **b}).status_code == 422, b


def test_mcp_filters_and_floor(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    from .test_mcp import _data, _params

    db = tmp_path / "mcp.db"
    with Memory(db, embedder="hash") as mem:
        mem.add_many(ITEMS, user_id="me")

    async def run() -> None:
        from mcp import Client

        async with Client(_params(db, "me")) as client:
            for flt, sessions in FILTERS:
                hits = _data(await client.call_tool("search", {"query": "boiler", **flt}))["hits"]
                rec = _data(await client.call_tool("recall", {"message": "boiler", **flt}))
                with Memory(db, embedder="hash") as m:
                    got = {m.get(h["id"]).session_id for h in hits}
                    packed = {m.get(e["id"]).session_id for e in rec["exchanges"]}
                assert got == sessions and packed == sessions, flt
            assert _data(await client.call_tool("search", {"query": "zzzqqq", "min_relevance": 0.3}))["hits"] == []
            rec = _data(await client.call_tool("recall", {"message": "zzzqqq", "min_relevance": 0.3}))
            assert rec["stopped"].startswith("relevance floor")

    anyio.run(run)


def test_cli_filters_and_floor(tmp_path: Path) -> None:
    from arbormem.cli import main

    db = tmp_path / "cli.db"
    with Memory(db, embedder="hash") as mem:
        mem.add_many(ITEMS, user_id="me")
    runner = CliRunner()
    base = ["--db", str(db), "--user", "me", "--embedder", "hash", "--json"]
    import json

    for args, n in ([["--session", "work"], 1], [["--meta", "room=cellar"], 2], [["--meta", "floor=1"], 1],
                    [["--since", "2024-05-10"], 2], [["--until", "2024-05-10", "--session", "work"], 0]):
        out = runner.invoke(main, ["search", "boiler", *base, *args])
        assert out.exit_code == 0, out.output
        assert len(json.loads(out.output)) == n, args
    out = runner.invoke(main, ["search", "zzzqqq", *base, "--min-relevance", "0.3"])
    assert out.exit_code == 0 and json.loads(out.output) == []
    out = runner.invoke(main, ["recall", "boiler", *base, "--session", "home"])
    assert out.exit_code == 0 and {e["session_id"] for e in json.loads(out.output)["exchanges"]} == {"home"}
    out = runner.invoke(main, ["search", "boiler", *base, "--meta", "noequals"])
    assert out.exit_code != 0
