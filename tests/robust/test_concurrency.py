"""Concurrency: several processes, each with several threads, add, consolidate, recall and
search on one SQLite file at once. No write is lost, sequence numbers stay unique and gapless, no error
(and so no "database is locked") reaches a caller, and ``check`` passes afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from arbormem.check import check

from .concurrency_worker import run
from .conftest import open_memory

WORKER = Path(__file__).with_name("concurrency_worker.py")


def _hammer(db: Path, processes: int, threads: int, ops: int) -> dict[str, list[str]]:
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(db), f"p{i}", str(threads), str(ops)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(processes)]
    results = [run(str(db), "main", threads, ops)]  # this process takes part too
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    written: dict[str, list[str]] = {"ann": [], "ben": []}
    for r in results:
        assert r["errors"] == [], r["errors"][:5]
        for user, ids in r["ids"].items():
            written[user].extend(ids)
    return written


def _verify(db: Path, written: dict[str, list[str]]) -> None:
    with open_memory(db) as m:
        for user, ids in written.items():
            stored = m.exchanges(user_id=user)
            completed = {e.id for e in stored if e.status == "completed"}
            assert set(ids) <= completed, f"lost writes of {user}: {set(ids) - completed}"
            assert len(ids) == len(set(ids))
            seqs = [e.seq for e in stored]
            assert seqs == list(range(1, len(seqs) + 1)), f"{user}: sequence has gaps or duplicates"
        report = check(m)
        assert report.ok, [str(p) for u in report.users for p in u.problems][:10]


def test_processes_and_threads_share_one_file(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    open_memory(db).close()  # created (and migrated) once, as an application would
    written = _hammer(db, processes=3, threads=3, ops=8)
    assert sum(len(v) for v in written.values()) >= 25
    _verify(db, written)


def test_processes_race_to_create_the_file(tmp_path: Path) -> None:
    # No pre-created file: every process runs the migrations at once.
    db = tmp_path / "fresh.db"
    written = _hammer(db, processes=3, threads=2, ops=4)
    _verify(db, written)


@pytest.mark.slow
def test_many_processes_and_threads(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    written = _hammer(db, processes=6, threads=4, ops=40)
    _verify(db, written)


def test_lock_held_past_the_budget_is_a_clear_store_error(tmp_path: Path) -> None:
    """Past the retry budget the caller gets StoreError with a plain message, never sqlite3's
    OperationalError, and nothing is written."""
    import sqlite3
    import time

    from arbormem import Memory
    from arbormem.errors import StoreError
    from arbormem.store.sqlite import SQLiteStore

    db = tmp_path / "locked.db"
    open_memory(db).close()
    m = Memory(store=SQLiteStore(db, busy_timeout=0.3), embedder="hash")
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with m:
            t0 = time.monotonic()
            with pytest.raises(StoreError, match="locked"):
                m.add([{"role": "user", "content": "blocked"}, {"role": "assistant", "content": "x"}],
                      user_id="u")
            assert time.monotonic() - t0 < 5
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    with open_memory(db) as m:
        assert m.exchanges(user_id="u") == []
