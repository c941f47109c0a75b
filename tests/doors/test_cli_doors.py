"""``arbormem serve`` and ``arbormem chat`` as real subprocesses (stdin piped)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from arbormem import Memory
from tests.support.openai_server import ScriptedOpenAIServer, answer

from .conftest import TOKENS, A, seed


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for key in ("ARBORMEM_LLM__BASE_URL", "ARBORMEM_LLM__MODEL", "ARBORMEM_API_TOKENS"):
        env.pop(key, None)
    return env


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "arbormem.cli", *args]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "cli.db"
    with Memory(path, embedder="hash") as mem:
        seed(mem)
    return path


def test_serve_command(db: Path) -> None:
    pytest.importorskip("uvicorn")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    no_tokens = subprocess.run(_cli("serve", "--db", str(db), "--embedder", "hash", "--port", str(port)),
                               env=_env(), capture_output=True, text=True, timeout=60)
    assert no_tokens.returncode == 1 and "ARBORMEM_API_TOKENS" in no_tokens.stderr
    open_host = subprocess.run(_cli("serve", "--db", str(db), "--no-auth", "--host", "0.0.0.0"),
                               env=_env(), capture_output=True, text=True, timeout=60)
    assert open_host.returncode != 0 and "loopback" in open_host.stderr

    proc = subprocess.Popen(_cli("serve", "--db", str(db), "--embedder", "hash", "--port", str(port), "--json"),
                            env={**_env(), "ARBORMEM_API_TOKENS": TOKENS},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        assert proc.stdout is not None
        started = json.loads(proc.stdout.readline())
        assert started == {"url": url, "health": url + "/health", "docs": url + "/docs",
                           "schema": url + "/openapi.json", "explorer": url + "/ui/", "auth": True}
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "serve did not start"
            time.sleep(0.1)
        while not httpx.get(url + "/health").json()["ready"]:  # the embedder loads in the background
            assert time.monotonic() < deadline, "never ready"
            time.sleep(0.05)
        r = httpx.post(url + "/v1/users/alice/recall", json={"query": "peanuts", "max_tokens": 200}, headers=A)
        assert r.status_code == 200 and "peanuts" in r.json()["text"]
        assert httpx.get(url + "/v1/users/carol/tree", headers=A).status_code == 403
    finally:
        proc.terminate()
        proc.wait(10)


def _chat(db: Path, stdin: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_cli("chat", "--db", str(db), "--user", "alice", "--embedder", "hash",
                               "--max-tokens", "300", *extra),
                          input=stdin, env=_env(), capture_output=True, text=True, timeout=120)


def test_chat_retrieval_only(db: Path) -> None:
    # Without a model nothing typed is stored unless asked: a stray "clear" stays out of the memory.
    out = _chat(db, "What can Leo eat? peanuts\nclear\n/recall chocolate cake\n/tree\n/forget\n"
                    "/note Leo likes rice crackers\n/forget\n/forget x_nope\n/quit\n")
    assert out.returncode == 0, out.stderr
    assert "retrieval-only" in out.stdout and "nothing is stored" in out.stdout
    assert "<memory-context>" in out.stdout and "peanuts" in out.stdout  # what would be injected
    assert "chocolate cake" in out.stdout and "[recall:" in out.stdout
    assert "└─" in out.stdout or "├─" in out.stdout  # the tree
    assert "nothing stored in this chat yet" in out.stdout  # /forget before any note
    assert "(stored as a note: x_" in out.stdout and "forgot x_" in out.stdout  # /note, then /forget
    assert "error: no exchange 'x_nope'" in out.stderr
    with Memory(db, embedder="hash") as mem:
        texts = [e.user_text for e in mem.exchanges(user_id="alice")]
        assert len(texts) == 3 and "clear" not in texts


def test_chat_notes_are_announced_and_the_last_one_can_be_forgotten(db: Path) -> None:
    out = _chat(db, "Leo now eats sunflower butter\nclear\n/forget last\n", "--notes")
    assert out.returncode == 0, out.stderr
    assert "every line you type is stored as a note" in out.stdout
    assert out.stdout.count("(stored as a note: x_") == 2 and "forgot x_" in out.stdout
    with Memory(db, embedder="hash") as mem:
        texts = [e.user_text for e in mem.exchanges(user_id="alice")]
        assert "Leo now eats sunflower butter" in texts and "clear" not in texts


def test_chat_json_prints_one_object_per_event(db: Path) -> None:
    out = _chat(db, "peanuts\n/note Maya wants a dinosaur cake\n/tree\n/help\n/forget\n/bogus\n", "--json")
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    assert [e["event"] for e in events] == ["start", "recall", "stored", "tree", "help", "forgot", "error"]
    assert events[0]["stores"] == "nothing" and "peanuts" in events[1]["text"]
    assert events[3]["tree"]["kind"] == "root"


def test_chat_with_a_model_injects_recall_every_turn(db: Path) -> None:
    with ScriptedOpenAIServer() as server:
        server.script(answer("Leo cannot have peanuts, so try rice crackers."), answer("Chocolate cake!"))
        out = _chat(db, "Snack ideas for Leo?\nWhich cake did we pick?\n",
                    "--llm-base-url", server.url, "--llm-model", "test-model")
        assert out.returncode == 0, out.stderr
        assert "assistant> Leo cannot have peanuts" in out.stdout
        assert "assistant> Chocolate cake!" in out.stdout
        sent = [r.body for r in server.chat_requests]
        assert len(sent) == 2
        assert "<memory-context>" in sent[0]["messages"][0]["content"]
        assert "peanuts" in sent[0]["messages"][0]["content"]
        # The second turn carries the first turn's history and a fresh recall.
        assert [m["role"] for m in sent[1]["messages"]] == ["system", "user", "assistant", "user"]
        assert "chocolate cake" in sent[1]["messages"][0]["content"]
    with Memory(db, embedder="hash") as mem:
        stored = mem.exchanges(user_id="alice")
        assert stored[-1].assistant_text == "Chocolate cake!" and stored[-1].status == "completed"
