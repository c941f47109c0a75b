"""Issue 20, "doors a user can trust", across the doors: typed one-line CLI errors that create
nothing, one user-id rule, idempotent re-import, documents replaced and deleted by source,
/docs offline with the bearer scheme, /health readiness. Real SQLite files, a real uvicorn
server on loopback, real subprocesses where the process boundary matters."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from arbormem import AsyncMemory, Memory
from arbormem.cli import main
from arbormem.embed.testing import HashEmbedder
from arbormem.errors import NotFoundError, ValidationError
from tests.conftest import chat

from .conftest import ADMIN, TOKENS, A, LiveServer, seed

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=True)


def _one_line_error(res: Any) -> str:
    """A failed command: non-zero exit, exactly one line on stderr, no traceback."""
    assert res.exit_code not in (0, None), res.output
    assert isinstance(res.exception, SystemExit), repr(res.exception)  # not an uncaught error
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    return lines[0]


# -- the CLI: every --help, and every error path in one line ------------------------------------
def _commands(group: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for name, cmd in sorted(group.commands.items()):
        out.append((*prefix, name))
        if hasattr(cmd, "commands"):
            out.extend(_commands(cmd, (*prefix, name)))
    return out


def test_every_command_has_help() -> None:
    cmds = _commands(main)
    assert {("tree",), ("serve",), ("mcp",), ("chat",), ("eval", "locomo"), ("bench-threads",)} <= set(cmds)
    for cmd in [(), *cmds]:
        res = _run(*cmd, "--help")
        assert res.exit_code == 0 and "Usage:" in res.output, (cmd, res.output)
        # Commands that print data take --json (serve/mcp print where they serve).
        if cmd and cmd[-1] in ("serve", "mcp", "chat", "bench-threads", "import", "tree", "stats"):
            assert "--json" in res.output, cmd


@pytest.fixture
def places(tmp_path: Path) -> dict[str, Path]:
    memory = tmp_path / "memory.db"
    with Memory(memory, embedder="hash") as mem:
        seed(mem)
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n")
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    folder = tmp_path / "folder"
    folder.mkdir()
    return {"memory": memory, "text": text, "other": other, "folder": folder,
            "missing": tmp_path / "nonexistent_dir" / "x.db"}


READ_COMMANDS = [("tree",), ("stats",), ("recall", "peanuts"), ("search", "peanuts"), ("forget", "--topic", "t_x")]


@pytest.mark.parametrize("cmd", READ_COMMANDS, ids=lambda c: c[0])
def test_read_commands_fail_in_one_line_and_create_nothing(cmd: tuple[str, ...], places: dict[str, Path]) -> None:
    env = {"ARBORMEM_EMBEDDER": "hash", "ARBORMEM_DATABASE_URL": ""}
    cases = {
        "missing": ("no SQLite memory at", 2),
        "text": ("is not a usable arbormem memory", 1),
        "folder": ("is a directory", 1),
        "other": ("is a SQLite database but not an arbormem memory", 1),
    }
    for place, (message, code) in cases.items():
        res = _run(*cmd, "--db", str(places[place]), "--user", "alice", env=env)
        line = _one_line_error(res)
        assert message in line and res.exit_code == code, (place, line)
    assert not places["missing"].parent.exists()  # no directory, no database
    assert places["text"].read_text() == "not a database\n"
    with sqlite3.connect(places["other"]) as conn:  # no arbormem table was added
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["t"]
    # An unknown user of an existing memory, and a user id that breaks the rule.
    line = _one_line_error(_run(*cmd, "--db", str(places["memory"]), "--user", "mallory", env=env))
    assert "no user 'mallory'" in line and "'alice'" in line
    line = _one_line_error(_run(*cmd, "--db", str(places["memory"]), "--user", "a/b", env=env))
    assert "user_id 'a/b' holds '/'" in line


def test_errors_are_one_line_in_a_real_process(places: dict[str, Path]) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "ARBORMEM_EMBEDDER": "hash"}
    env.pop("ARBORMEM_API_TOKENS", None)
    for args in (["tree", "--db", str(places["missing"])], ["stats", "--db", str(places["text"])],
                 ["search", "x", "--db", str(places["folder"])],
                 ["recall", "x", "--db", str(places["memory"]), "--user", "nobody"],
                 ["serve", "--db", str(places["missing"])],  # no token policy: refused before opening
                 ["mcp", "--db", str(places["missing"]), "--user", "a\nb"]):
        proc = subprocess.run([sys.executable, "-m", "arbormem.cli", *args], env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("error:"), (args, proc.stderr)
    assert not places["missing"].parent.exists()


# -- every documented command line runs ----------------------------------------------------------
#: Documented commands not run here, and where they are tested instead.
NOT_RUN = {
    "eval": "tests/eval (needs the LoCoMo files; minutes)",
    "bench": "tests/eval/test_bench.py (minutes)",
    "bench-consolidate": "tests/organize (minutes)",
    "migrate-store": "tests/store/test_migrate.py (needs PostgreSQL)",
    "serve": "tests/doors/test_cli_doors.py (a server: runs until stopped)",
    "mcp": "tests/doors/test_mcp.py (a server: runs until stopped)",
}


def _documented_commands() -> list[str]:
    out = []
    for doc in (ROOT / "README.md", ROOT / "docs" / "doors.md"):
        for block in re.findall(r"```bash\n(.*?)```", doc.read_text("utf-8"), re.S):
            for line in block.splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                if line.startswith("arbormem "):
                    out.append(line.rstrip("&").strip())
    return out


def test_every_documented_command_line_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            demo_data: dict[str, Any]) -> None:
    lines = _documented_commands()
    assert len(lines) >= 15
    monkeypatch.chdir(tmp_path)
    (tmp_path / "chats.jsonl").write_text("\n".join(json.dumps(x) for x in demo_data["exchanges"]), "utf-8")
    env = {"ARBORMEM_EMBEDDER": "hash", "ARBORMEM_DATABASE_URL": "", "ARBORMEM_LLM__BASE_URL": "",
           "ARBORMEM_LLM__MODEL": ""}
    ran = 0
    for line in lines:
        words = shlex.split(line)[1:]
        if words[0] in NOT_RUN or "--llm-base-url" in words:
            continue
        if words[0] == "forget":  # the documented placeholder: a real topic id
            with Memory(tmp_path / "memory.db", embedder="hash") as mem:
                leaf = next(t.id for t in mem.topics(user_id="u1") if t.kind == "topic")
            words = [leaf if w == "t_..." else w for w in words]
        if words[0] == "reembed":
            words = [w if w != "local" else "hash:128" for w in words]
        if words[0] == "check":
            words = [w for w in words if w != "[--repair]"]
        if words[0] == "chat":
            res = CliRunner().invoke(main, words, env=env, input="/tree\n/quit\n")
        else:
            res = _run(*words, env=env)
        assert res.exit_code == 0, (line, res.output, res.stderr if hasattr(res, "stderr") else "")
        ran += 1
    assert ran >= 10


def test_the_readme_python_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The quick start, async and documents examples of README.md, as printed (with the hash
    embedder and a real topic id for the documented placeholder). The integrations and
    consolidation snippets are fragments of a larger program (a graph builder, an agent);
    test_integrations.py and tests/organize run their calls."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text("utf-8"), re.S)
    quick, aio_block, docs_block = blocks[0], blocks[1], blocks[3]
    assert "Memory(\"memory.db\")" in quick and "AsyncMemory" in aio_block and "add_document" in docs_block
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ARBORMEM_EMBEDDER", "hash")
    monkeypatch.delenv("ARBORMEM_DATABASE_URL", raising=False)
    (tmp_path / "handbook.md").write_text("Expenses. Submit receipts within 30 days of purchase.\n\n"
                                          "Security. Rotate your badge code every two weeks.\n", "utf-8")
    exec(quick.replace("topic_id", 'mem.topics(user_id="u1")[-1].id'), {})
    exec(aio_block, {})
    exec("from arbormem import Memory\nmem = Memory('memory.db')\n" + docs_block + "\nmem.close()", {})


# -- one user-id rule, every door ----------------------------------------------------------------
BAD_USERS = {"a/b": "'/'", "..": "'..'", "x/../y": "'/'", "a\nb": "U+000A", "a\x00b": "U+0000",
             " alice": "whitespace", "": "empty"}


def test_user_ids_python_and_async(tmp_path: Path) -> None:
    with Memory(tmp_path / "u.db", embedder="hash") as mem:
        for bad, why in BAD_USERS.items():
            for call in (lambda u: mem.add(chat("hi", "hello"), user_id=u),
                         lambda u: mem.recall("hi", user_id=u), lambda u: mem.tree(user_id=u)):
                with pytest.raises(ValidationError, match=re.escape(why)):
                    call(bad)
        assert mem.add(chat("hi", "hello"), user_id="slack:U123 élan").user_id == "slack:U123 élan"

    async def run() -> None:
        async with AsyncMemory(tmp_path / "u.db", embedder="hash") as amem:
            for bad, why in BAD_USERS.items():
                with pytest.raises(ValidationError, match=re.escape(why)):
                    await amem.search("hi", user_id=bad)

    asyncio.run(run())


def test_a_stored_user_that_breaks_the_rule_can_still_be_deleted(tmp_path: Path) -> None:
    db = tmp_path / "legacy.db"
    with Memory(db, embedder="hash") as mem:
        mem.add(chat("hi", "hello"), user_id="ok")
    with sqlite3.connect(db) as conn:  # as an earlier version could have stored it
        conn.execute("UPDATE exchanges SET user_id = 'team/alice'")
    with Memory(db, embedder="hash") as mem:
        with pytest.raises(ValidationError):
            mem.exchanges(user_id="team/alice")
        assert mem.delete_user("team/alice") == 1 and mem.store.list_users() == []


def test_user_ids_http_mcp_and_integrations(seeded: Memory) -> None:
    from arbormem.server.app import create_app

    server = LiveServer(create_app(seeded, tokens=TOKENS))
    try:
        with httpx.Client(base_url=server.url, headers=ADMIN, timeout=30) as c:
            for raw, why in (("a%2Fb", "'/'"), ("%2E%2E", "'..'"), ("a..b", "'..'"), ("a%0Ab", "U+000A"), ("a%00b", "U+0000"),
                             ("%20alice", "whitespace"), ("%FF", "not valid Unicode")):
                r = c.get(f"/v1/users/{raw}/tree")
                assert r.status_code == 422, (raw, r.text)
                assert r.json()["error"]["code"] == "invalid_input" and why in r.json()["error"]["message"]
            r = c.post("/v1/users/a%2Fb/exchanges", json={"messages": chat("x", "y")})
            assert r.status_code == 422 and "'/'" in r.json()["error"]["message"]
            # A valid id with reserved URL characters round-trips percent-encoded.
            odd = "team:alice?#%"
            r = c.post(f"/v1/users/{_q(odd)}/exchanges",
                       json={"messages": chat("odd id", "fine")})
            assert r.status_code == 201 and r.json()["user_id"] == odd
    finally:
        server.stop()
    assert "odd id" in seeded.exchanges(user_id="team:alice?#%")[0].user_text

    from arbormem.server.mcp import create_server

    pytest.importorskip("mcp")
    with pytest.raises(ValidationError, match="'/'"):
        create_server(seeded, "a/b")
    pytest.importorskip("langgraph")
    from arbormem.integrations.langchain import memory_tools
    from arbormem.integrations.langgraph import ArbormemStore
    from arbormem.integrations.openai_agents import ArbormemSession

    for make in (lambda u: ArbormemStore(seeded, u), lambda u: memory_tools(seeded, u),
                 lambda u: ArbormemSession(seeded, u, "s1")):
        for bad, why in BAD_USERS.items():
            with pytest.raises(ValidationError, match=re.escape(why)):
                make(bad)


def _q(user: str) -> str:
    from urllib.parse import quote

    return quote(user, safe="")


# -- idempotent re-import, every door ------------------------------------------------------------
def test_reimport_is_idempotent_in_python_async_and_http(tmp_path: Path, demo_data: dict[str, Any]) -> None:
    items = demo_data["exchanges"]
    with Memory(tmp_path / "i.db", embedder="hash") as mem:
        first = mem.import_exchanges(items, user_id="u")
        assert len(first.added) == len(items) and first.skipped == ()
        again = mem.import_exchanges(items, user_id="u")
        assert again.added == () and [s.index for s in again.skipped] == list(range(len(items)))
        assert [s.exchange_id for s in again.skipped] == [e.id for e in first.added]
        # One new item among known ones: only it is stored.
        grown = mem.import_exchanges([*items, {"messages": chat("A new question", "A new answer")}], user_id="u")
        assert len(grown.added) == 1 and len(grown.skipped) == len(items)
        # A deleted exchange is no longer a duplicate; add_many still stores every item.
        mem.delete(first.added[0].id, user_id="u")
        assert [s.index for s in mem.import_exchanges(items[:2], user_id="u").skipped] == [1]
        assert len(mem.add_many(items[:2], user_id="u")) == 2
        # Metadata is not part of an exchange's identity; its time, when given, is.
        tagged = [{**items[3], "metadata": {"imported_by": "tool-2"}}]
        assert mem.import_exchanges(tagged, user_id="u").added == ()
        moved = [{**items[3], "at": "2001-01-01T00:00:00Z"}]
        assert len(mem.import_exchanges(moved, user_id="u").added) == 1
        assert len(mem.import_exchanges(items, user_id="other").added) == len(items)  # per user

    async def run() -> None:
        async with AsyncMemory(tmp_path / "ai.db", embedder="hash") as amem:
            assert len((await amem.import_exchanges(items, user_id="u")).added) == len(items)
            assert len((await amem.import_exchanges(items, user_id="u")).skipped) == len(items)

    asyncio.run(run())

    from arbormem.server.app import create_app

    with Memory(tmp_path / "h.db", embedder="hash") as mem:
        server = LiveServer(create_app(mem, tokens=TOKENS))
        try:
            body = {"exchanges": items}
            r1 = httpx.post(server.url + "/v1/users/alice/exchanges/import", json=body, headers=A, timeout=60)
            r2 = httpx.post(server.url + "/v1/users/alice/exchanges/import", json=body, headers=A, timeout=60)
        finally:
            server.stop()
        assert r1.status_code == r2.status_code == 201
        assert r1.json()["imported"] == len(items) and r1.json()["skipped"] == []
        assert r2.json()["imported"] == 0 and r2.json()["ids"] == []
        assert [s["exchange_id"] for s in r2.json()["skipped"]] == r1.json()["ids"]
        assert len(mem.exchanges(user_id="alice")) == len(items)


# -- documents: replace and delete by source, every door ------------------------------------------
def _readme(version: int) -> str:
    parts = [f"Section {i}. " + " ".join(f"Sentence {j} of section {i} explains setting number {i * 100 + j}."
                                          for j in range(12)) for i in range(40)]
    parts[17] = parts[17].replace("setting number 1705", f"setting number 1705, revision {version}")
    return "\n\n".join(parts)


def test_documents_are_replaced_and_deleted_by_source_in_python_and_async(tmp_path: Path) -> None:
    with Memory(tmp_path / "d.db", embedder="hash") as mem:
        v1 = mem.add_document(_readme(1), source="README.md", user_id="u")
        v2 = mem.add_document(_readme(2), source="README.md", user_id="u")
        held = [e for e in mem.exchanges(user_id="u") if e.metadata.get("source") == "README.md"]
        assert len(held) == v2.chunks  # the old version's chunks are gone, not kept beside
        assert 1 <= len(v2.added) <= 3 and len(v2.removed) == len(v2.added)
        assert set(v2.removed) <= {e.id for e in v1.added}
        text = mem.recall("setting number 1705 revision", user_id="u", max_tokens=2000).text
        assert "revision 2" in text and "revision 1" not in text
        assert sum("revision 1" in e.user_text for e in mem.exchanges(user_id="u")) == 0
        # The same chunk under another source belongs to that source.
        other = mem.add_document(_readme(2), source="copy.md", user_id="u")
        assert len(other.added) == other.chunks
        gone = mem.delete_document("README.md", user_id="u")
        assert len(gone) == v2.chunks
        assert all(e.metadata.get("source") == "copy.md" for e in mem.exchanges(user_id="u"))
        assert not mem.search("revision 2 setting 1705", user_id="u", limit=50) or all(
            h.exchange.metadata["source"] == "copy.md" for h in mem.search("revision 2", user_id="u", limit=50))
        with pytest.raises(NotFoundError):
            mem.delete_document("README.md", user_id="u")
        with pytest.raises(NotFoundError):
            mem.delete_document("copy.md", user_id="someone-else")

    async def run() -> None:
        async with AsyncMemory(tmp_path / "ad.db", embedder="hash") as amem:
            await amem.add_document(_readme(1), source="README.md", user_id="u")
            rep = await amem.add_document(_readme(2), source="README.md", user_id="u")
            assert rep.removed
            assert len(await amem.delete_document("README.md", user_id="u")) == rep.chunks

    asyncio.run(run())


def test_documents_are_replaced_and_deleted_by_source_over_http(seeded: Memory) -> None:
    from arbormem.server.app import create_app

    server = LiveServer(create_app(seeded, tokens=TOKENS))
    try:
        with httpx.Client(base_url=server.url, headers=A, timeout=60) as c:
            v1 = c.post("/v1/users/alice/documents", json={"text": _readme(1), "source": "docs/README.md"}).json()
            v2 = c.post("/v1/users/alice/documents", json={"text": _readme(2), "source": "docs/README.md"}).json()
            assert v2["removed"] and set(v2["removed"]) <= set(v1["added"])
            rec = c.post("/v1/users/alice/recall", json={"query": "setting number 1705 revision", "max_tokens": 2000})
            assert "revision 2" in rec.json()["text"] and "revision 1" not in rec.json()["text"]
            gone = c.delete("/v1/users/alice/documents", params={"source": "docs/README.md"})
            assert gone.status_code == 200 and len(gone.json()["removed"]) == v2["chunks"]
            again = c.delete("/v1/users/alice/documents", params={"source": "docs/README.md"})
            assert again.status_code == 404 and again.json()["error"]["code"] == "not_found"
            assert c.delete("/v1/users/carol/documents", params={"source": "x"}).status_code == 403
    finally:
        server.stop()
    assert not [e for e in seeded.exchanges(user_id="alice") if e.metadata.get("kind") == "document"]


# -- /docs offline, the bearer scheme, /health readiness -------------------------------------------
def test_docs_and_schema_over_http(live: LiveServer) -> None:
    page = httpx.get(live.url + "/docs")
    assert page.status_code == 200
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
    assert urls and not [u for u in urls if re.match(r"(https?:)?//", u)]  # nothing from outside
    assert not re.search(r"https?://", page.text)
    for u in urls:
        assert httpx.get(live.url + u).status_code == 200, u
    schema = httpx.get(live.url + "/openapi.json").json()
    assert schema["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http", "scheme": "bearer", "bearerFormat": "token",
        "description": "A token of ARBORMEM_API_TOKENS, bound to the user ids it may access."}
    for path, ops in schema["paths"].items():
        for op in ops.values():
            secured = op.get("security") == [{"bearerAuth": []}]
            assert secured == path.startswith("/v1/"), path
    assert httpx.get(live.url + "/redoc").status_code == 404  # it loaded from a CDN


class _SlowEmbedder(HashEmbedder):
    """A hash embedder whose first call takes as long as a model load."""

    def __init__(self, seconds: float) -> None:
        super().__init__(64)
        self.seconds = seconds
        self.loaded = threading.Event()

    def embed_batch(self, texts: Any) -> Any:
        if not self.loaded.is_set():
            time.sleep(self.seconds)
            self.loaded.set()
        return super().embed_batch(texts)


def test_health_says_when_the_embedder_is_ready(tmp_path: Path) -> None:
    from arbormem.server.app import create_app

    slow = _SlowEmbedder(1.5)
    with Memory(tmp_path / "h.db", embedder=slow) as mem:
        server = LiveServer(create_app(mem, tokens=TOKENS))
        try:
            first = httpx.get(server.url + "/health").json()
            assert first["ready"] is False and first["status"] == "starting"
            assert slow.loaded.wait(10)  # loaded in the background, with no request asking
            time.sleep(0.2)
            ready = httpx.get(server.url + "/health").json()
            assert ready == {"status": "ok", "version": ready["version"], "ready": True}
        finally:
            server.stop()


def test_a_token_given_twice_is_refused() -> None:
    from arbormem.errors import ConfigError
    from arbormem.server.auth import TokenPolicy

    with pytest.raises(ConfigError, match="appears twice"):
        TokenPolicy.parse("tokA:alice;tokB:bob;tokA:carol")
