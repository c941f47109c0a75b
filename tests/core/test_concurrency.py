"""Concurrent writers: no two begins share a sequence number, nothing is lost."""

from __future__ import annotations

import multiprocessing as mp
import threading
from pathlib import Path

from arbormem import Memory
from arbormem.embed.testing import HashEmbedder
from tests.conftest import chat


def test_concurrent_begin_threads_get_unique_sequences(mem: Memory) -> None:
    seqs: list[int] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(15):
                x = mem.begin(f"thread {n} message {i}", user_id="shared")
                with lock:
                    seqs.append(x.seq)
                mem.complete(x.id, f"reply {n}/{i}")
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(seqs) == list(range(1, 121))
    stored = mem.exchanges(user_id="shared")
    assert len(stored) == 120 and all(e.status == "completed" and e.topic_id for e in stored)
    assert mem.tree(user_id="shared").size == 120


def _writer(path: str, n: int, out) -> None:  # runs in a child process
    with Memory(path, embedder=HashEmbedder()) as m:
        seqs = [m.add(chat(f"proc {n} item {i} gardening tomatoes", "ok"), user_id="p").seq for i in range(10)]
    out.put(seqs)


def test_concurrent_writer_processes(db_path: Path) -> None:
    Memory(db_path, embedder=HashEmbedder()).close()  # create the schema once
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(str(db_path), n, q)) for n in range(4)]
    for p in procs:
        p.start()
    results = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    seqs = sorted(s for r in results for s in r)
    assert seqs == list(range(1, 41))
    with Memory(db_path, embedder=HashEmbedder()) as m:
        assert m.tree(user_id="p").size == 40
        assert len({e.seq for e in m.exchanges(user_id="p")}) == 40
