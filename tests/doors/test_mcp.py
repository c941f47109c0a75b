"""The MCP server through the SDK's own client, over a real stdio subprocess
(``python -m arbormem.cli mcp``), and once over streamable HTTP."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from arbormem import Memory

from .conftest import seed

pytest.importorskip("mcp")

from mcp import Client, StdioServerParameters  # noqa: E402


def _params(db: Path, user: str) -> StdioServerParameters:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("ARBORMEM_LLM__BASE_URL", None)
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "arbormem.cli", "mcp", "--db", str(db), "--user", user, "--embedder", "hash"],
        env=env,
    )


def _data(result: Any) -> Any:
    assert not result.is_error, result.content
    if result.structured_content is not None:
        return result.structured_content
    return json.loads(result.content[0].text)


def _error(result: Any) -> str:
    assert result.is_error
    return result.content[0].text


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "mcp.db"
    with Memory(path, embedder="hash") as mem:
        seed(mem)
    return path


def test_tools_over_stdio(db: Path) -> None:
    with Memory(db, embedder="hash") as mem:
        carol_x = mem.exchanges(user_id="carol")[0].id
        carol_t = next(t.id for t in mem.topics(user_id="carol") if t.kind == "topic")

    async def main() -> None:
        async with Client(_params(db, "alice"), read_timeout_seconds=60) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert set(tools) == {"remember", "recall", "search", "list_topics", "read_topic", "forget"}
            for name in ("recall", "search", "list_topics", "read_topic"):
                assert tools[name].annotations.read_only_hint is True, name
            assert tools["forget"].annotations.destructive_hint is True
            assert tools["remember"].annotations.read_only_hint is False
            assert tools["recall"].description and "max_tokens" in json.dumps(tools["recall"].input_schema)

            saved = _data(await client.call_tool("remember", {
                "message": "Leo's favourite snack is rice crackers.", "reply": "Noted: rice crackers."}))
            assert saved["seq"] == 4 and saved["topic_id"] and saved["topic_path"]
            note = _data(await client.call_tool("remember", {"message": "Buy balloons for the party."}))

            rec = _data(await client.call_tool("recall", {"message": "What snacks for Leo? peanuts", "max_tokens": 300}))
            assert 0 < rec["tokens"] <= 300 and "peanuts" in rec["text"] and rec["topics"]
            hits = _data(await client.call_tool("search", {"query": "rice crackers", "limit": 3}))["hits"]
            assert hits[0]["id"] == saved["id"] and hits[0]["path"]

            top = _data(await client.call_tool("list_topics", {}))
            assert top["parent"] is None and top["children"]
            ids: list[str] = []
            queue = [c for c in top["children"]]
            while queue:  # browse down to the leaves
                node = queue.pop()
                if node["kind"] == "theme":
                    queue += _data(await client.call_tool("list_topics", {"parent_id": node["id"]}))["children"]
                else:
                    ids.append(node["id"])
            assert ids
            leaf = ids[0]
            t0 = _data(await client.call_tool("read_topic", {"topic_id": leaf}))
            assert t0["depth"] == 0 and t0["topic"]["title"] and "detail" not in t0
            t1 = _data(await client.call_tool("read_topic", {"topic_id": leaf, "depth": 1}))
            assert t1["detail"] and t1["detail_source"] == "extractive" and "exchanges" not in t1
            t2 = _data(await client.call_tool("read_topic", {"topic_id": leaf, "depth": 2}))
            assert t2["exchanges"] and all(e["topic_id"] == leaf for e in t2["exchanges"])
            assert _data(await client.call_tool("read_topic", {"topic_id": leaf, "tier": 2})) == t2  # old name
            assert "invalid_input" in _error(await client.call_tool("read_topic", {"topic_id": leaf, "depth": 7}))

            # Isolation: carol's ids are invisible to a server bound to alice.
            assert "not_found" in _error(await client.call_tool("read_topic", {"topic_id": carol_t, "depth": 2}))
            assert "not_found" in _error(await client.call_tool("list_topics", {"parent_id": carol_t}))
            assert "not_found" in _error(await client.call_tool("forget", {"exchange_id": carol_x}))
            assert "not_found" in _error(await client.call_tool("forget", {"topic_id": carol_t}))
            leak = await client.call_tool("search", {"query": "vault code cello", "limit": 50})
            assert "7431" not in json.dumps(_data(leak)) and "cello" not in json.dumps(_data(leak)["hits"])
            leak2 = _data(await client.call_tool("recall", {"message": "secret code? instrument?"}))
            assert "7431" not in leak2["text"] and "cello" not in leak2["text"]

            gone = _data(await client.call_tool("forget", {"exchange_id": note["id"]}))
            assert gone["deleted"] == [note["id"]]
            hits = _data(await client.call_tool("search", {"query": "balloons", "limit": 10}))["hits"]
            assert note["id"] not in [h["id"] for h in hits]

    anyio.run(main)
    with Memory(db, embedder="hash") as mem:
        assert len(mem.exchanges(user_id="carol")) == 2
        assert len(mem.exchanges(user_id="alice")) == 4


def test_streamable_http_needs_a_token_for_its_user(db: Path, tmp_path: Path) -> None:
    import httpx
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    from .conftest import TOKENS

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    params = _params(db, "alice")
    # No token policy: refused before anything is opened (the database is not created).
    fresh = tmp_path / "never.db"
    refused = subprocess.run([params.command, "-m", "arbormem.cli", "mcp", "--db", str(fresh), "--user", "alice",
                              "--embedder", "hash", "--http", "--port", str(port)],
                             env={k: v for k, v in params.env.items() if k != "ARBORMEM_API_TOKENS"},
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "ARBORMEM_API_TOKENS" in refused.stderr and not fresh.exists()
    assert len(refused.stderr.strip().splitlines()) == 1

    proc = subprocess.Popen([params.command, *params.args, "--http", "--port", str(port)],
                            env={**params.env, "ARBORMEM_API_TOKENS": TOKENS},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                assert time.monotonic() < deadline, "MCP HTTP server did not start"
                time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/mcp"
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                           "clientInfo": {"name": "t", "version": "0"}}}
        accept = {"Accept": "application/json, text/event-stream"}
        for headers, status, code in (({}, 401, "unauthorized"),
                                      ({"Authorization": "Bearer wrong-token"}, 401, "unauthorized"),
                                      ({"Authorization": "Bearer tok-carol-1"}, 403, "forbidden")):
            r = httpx.post(url, json=init, headers={**accept, **headers}, timeout=30)
            assert r.status_code == status and r.json()["error"]["code"] == code

        async def main(token: str) -> dict[str, Any]:
            client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
            async with Client(streamable_http_client(url, http_client=client)) as mcp_client:
                return _data(await mcp_client.call_tool("recall", {"message": "party in the park", "max_tokens": 200}))

        assert "park" in anyio.run(main, "tok-alice-bob")["text"]
        assert "park" in anyio.run(main, "tok-admin-1")["text"]  # a '*' token may access every user
    finally:
        proc.terminate()
        proc.wait(10)


def test_read_topic_depth1_uses_the_llm_when_configured(db: Path) -> None:
    from tests.support.openai_server import ScriptedOpenAIServer, answer_json

    with Memory(db, embedder="hash") as mem:
        leaf = next(t.id for t in mem.topics(user_id="alice") if t.kind == "topic")
    with ScriptedOpenAIServer() as server:
        server.responder = lambda body: answer_json({"detail": "Leo must avoid peanuts entirely. Snacks need checking."})
        params = _params(db, "alice")
        params.env.update({"ARBORMEM_LLM__BASE_URL": server.url, "ARBORMEM_LLM__MODEL": "test-model"})

        async def main() -> None:
            async with Client(params, read_timeout_seconds=60) as client:
                t1 = _data(await client.call_tool("read_topic", {"topic_id": leaf, "depth": 1}))
                assert t1["detail_source"] == "llm" and t1["detail"].startswith("Leo must avoid peanuts")

        anyio.run(main)
        assert any("detail" in json.dumps(r.body) for r in server.chat_requests)


def test_server_reports_its_version(db: Path) -> None:
    from arbormem import __version__
    from arbormem.server.mcp import create_server

    with Memory(db, embedder="hash") as mem:
        assert create_server(mem, "alice").version == __version__ != ""
