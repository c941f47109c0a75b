"""Crash safety: a child process ingesting into a SQLite memory is SIGKILLed at random
moments, many times over one file; after every kill the memory reopens with every exchange
whose write call returned present, completed and searchable, and ``check`` passes with no
repair (nothing half-written is visible).

Kill counts: ``ARBORMEM_CRASH_KILLS`` (default 24; the slow test runs 200; see
docs/robustness.md for the long mode).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arbormem.check import check

from .conftest import open_memory

CHILD = Path(__file__).with_name("crash_child.py")


def _read_log(log: Path) -> tuple[dict[str, str], set[str], int]:
    done: dict[str, str] = {}
    pending: set[str] = set()
    ready = 0
    text = log.read_text("utf-8") if log.exists() else ""
    # A line counts once it is whole ("... $"): a kill can tear the line being written (it
    # is then cut off by the next child's leading newline, or is the file's last line).
    for line in text.split("\n"):
        parts = line.split()
        if not parts or parts[-1] != "$":
            continue
        if parts[0] == "done" and len(parts) == 4:
            done[parts[1]] = parts[2]
        elif parts[0] == "pending" and len(parts) == 3:
            pending.add(parts[1])
        elif parts == ["ready", "$"]:
            ready += 1
    return done, pending, ready


def _kill_once(db: Path, log: Path, seed: int, rng: random.Random) -> None:
    """Start the child, let it run a random while (sometimes killing it while it is still
    opening the memory), SIGKILL it, reap it."""
    before = _read_log(log)[2] if log.exists() else 0
    proc = subprocess.Popen([sys.executable, str(CHILD), str(db), str(log), str(seed)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        if rng.random() < 0.15:
            time.sleep(rng.uniform(0.0, 0.6))  # during start-up / migration
        else:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and proc.poll() is None:
                if log.exists() and _read_log(log)[2] > before:
                    break
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.5))
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "child exited"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
        if proc.stderr is not None:
            proc.stderr.close()


def _verify(db: Path, log: Path, seen: set[str]) -> int:
    """Every reported exchange present and completed; the new ones searchable; check clean.
    Returns how many exchanges were reported so far."""
    done, pending, _ = _read_log(log)
    with open_memory(db) as m:
        for user in ("user0", "user1"):
            stored = {e.id: e for e in m.exchanges(user_id=user)}
            for ex_id in [i for i in done if i in stored]:
                assert stored[ex_id].status == "completed", ex_id
            for ex_id in pending:
                if ex_id in stored:
                    assert stored[ex_id].status in ("pending", "completed")
        missing = [i for i in done if m.store.get_exchange(i) is None]
        assert not missing, f"{len(missing)} reported exchanges lost: {missing[:5]}"
        for ex_id in [i for i in done if i not in seen]:
            ex = m.get(ex_id)
            if ex.archived:  # consolidation archives duplicates; they stay in the transcript
                continue
            # Both indexes answer for it: its unique token lexically (neighbours in the same
            # session share it through their expanded keys, hence k=5), its text densely.
            lexical = m.store.text_search(ex.user_id, "exchange", [done[ex_id]], 5)
            assert ex_id in {i for i, _ in lexical}, f"{ex_id} not in the full-text index"
            dense = m.store.vector_search(ex.user_id, "exchange", m.embedder.embed([ex.text])[0], 3)
            assert ex_id in {i for i, _ in dense}, f"{ex_id} not in the vector index"
            seen.add(ex_id)
        report = check(m)
        assert report.ok, [str(p) for u in report.users for p in u.problems][:10]
    return len(done)


def _run(tmp_path: Path, kills: int, seed: int) -> None:
    db, log = tmp_path / "crash.db", tmp_path / "done.log"
    rng = random.Random(seed)
    seen: set[str] = set()
    reported = 0
    for i in range(kills):
        _kill_once(db, log, seed * 10_000 + i, rng)
        reported = _verify(db, log, seen)
    assert reported > kills, f"only {reported} exchanges reported in {kills} runs"
    # The closing note of issue 9 quotes these (pytest -s shows them).
    print(f"crash: {kills} SIGKILLs, {reported} reported exchanges, none lost, check clean")


def test_sigkill_during_ingest(tmp_path: Path) -> None:
    _run(tmp_path, int(os.environ.get("ARBORMEM_CRASH_KILLS", "24")), seed=1)


@pytest.mark.slow
def test_sigkill_during_ingest_many(tmp_path: Path) -> None:
    _run(tmp_path, int(os.environ.get("ARBORMEM_CRASH_KILLS", "200")), seed=2)


def _transcript(db: Path) -> list[tuple[object, ...]]:
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT id, user_id, seq, status, messages, user_text, assistant_text, "
                            "user_at, assistant_at, metadata FROM exchanges ORDER BY rid").fetchall()
    finally:
        conn.close()


def test_sigkill_during_repair(tmp_path: Path) -> None:
    """``check --repair`` killed at random moments: the transcript never changes and the
    derived data is either the damaged state as before (rolled back) or fully repaired."""
    import sqlite3

    db = tmp_path / "repair.db"
    words = ["orchard", "compiler", "violin", "glacier", "ledger", "saffron"]
    with open_memory(db) as m:
        m.add_many([{"messages": [{"role": "user", "content": f"{words[i % 6]} {words[i // 6 % 6]} {i}"},
                                  {"role": "assistant", "content": f"reply {i}"}], "session_id": f"s{i // 50}"}
                    for i in range(800)], user_id="u")
    conn = sqlite3.connect(db)
    with conn:  # damage: a third of the vectors and full-text rows gone, one leaf's size wrong
        conn.execute("DELETE FROM vectors WHERE kind = 'exchange' AND rid % 3 = 0")
        conn.execute("DELETE FROM exchange_fts WHERE rowid % 3 = 1")
        conn.execute("UPDATE topics SET size = size + 1 WHERE rid = (SELECT MAX(rid) FROM topics WHERE kind = 'topic')")
    conn.close()
    before = _transcript(db)
    with open_memory(db) as m:
        damaged = {str(p) for u in check(m).users for p in u.problems}
    assert damaged
    rng = random.Random(7)
    outcomes = {"rolled back": 0, "repaired": 0}
    for _ in range(int(os.environ.get("ARBORMEM_REPAIR_KILLS", "5"))):
        proc = subprocess.Popen([sys.executable, "-m", "arbormem.cli", "check", "--db", str(db), "--repair"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.4, 2.0))
        proc.kill()
        proc.wait(timeout=30)
        assert _transcript(db) == before
        with open_memory(db) as m:
            now = check(m)
        problems = {str(p) for u in now.users for p in u.problems}
        if now.ok:
            outcomes["repaired"] += 1
            break
        assert problems == damaged  # all or nothing: a half-done repair is never visible
        outcomes["rolled back"] += 1
    with open_memory(db) as m:
        assert check(m, repair=True).ok
    assert _transcript(db) == before
    print(f"repair kills: {outcomes}")
