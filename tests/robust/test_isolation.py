"""Isolation: deleting a user, or one exchange, leaves no trace of its text anywhere in the
database file. Verified the hard way: after a WAL checkpoint and VACUUM, the raw bytes of the
file (and any -wal/-shm beside it) are scanned for a marker only the deleted data contained,
while another user's marker is still found (so the scan can see text at all)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from .conftest import open_memory, turn


def _compact(db: Path) -> None:
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def _bytes(db: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(db.parent.glob(db.name + "*")))


def _fill(m, user: str, marker: str, n: int = 30) -> list[str]:
    subjects = ["bread baking", "bike repair", "chess openings"]
    return [m.add(turn(f"{subjects[i % 3]} {marker} question {i}", f"{marker} answer {i}"),
                  user_id=user, session_id="s").id for i in range(n)]


def test_delete_user_leaves_no_bytes_behind(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    with open_memory(db) as m:
        _fill(m, "alice", "zebracornalice")
        _fill(m, "bob", "zebracornbob")
        m.consolidate("alice")
        m.recall("zebracornalice bread", user_id="alice")
        assert m.delete_user("alice") == 30
        assert m.exchanges(user_id="alice") == [] and m.topics(user_id="alice") == []
    _compact(db)
    raw = _bytes(db)
    assert b"zebracornbob" in raw
    assert b"zebracornalice" not in raw
    conn = sqlite3.connect(db)
    try:
        for table in ("exchanges", "topics", "vectors", "changes", "term_df", "user_state"):
            assert conn.execute(f"SELECT COUNT(*) FROM {table} WHERE user_id = 'alice'").fetchone()[0] == 0
    finally:
        conn.close()


def test_delete_exchange_leaves_no_bytes_behind(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    with open_memory(db) as m:
        ids = _fill(m, "carol", "plainword")
        for i in (0, 7, 29):  # first (it named its topic), middle, and the open tail
            victim = m.add(turn(f"bike repair secretmarker{i} question", f"secretmarker{i} reply"),
                           user_id="carol", session_id="s")
            m.add(turn("bike repair follow up", "more"), user_id="carol", session_id="s")
            m.delete(victim.id)
        m.delete(ids[3])
        from arbormem.check import check

        assert check(m).ok
    _compact(db)
    raw = _bytes(db)
    assert b"plainword" in raw
    assert b"secretmarker" not in raw
