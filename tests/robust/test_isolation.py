"""Isolation: deleting a user, a topic or one exchange, leaves no trace of its text anywhere in the
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


def _files(db: Path) -> bytes:
    """The database file and its WAL as they are on disk, read while the memory is open."""
    return b"".join(p.read_bytes() for p in (db, db.with_name(db.name + "-wal")) if p.exists())


def test_deleted_text_leaves_an_open_memory(tmp_path: Path) -> None:
    """Issue 19: without VACUUM, and with the memory still open, neither the database file nor
    its WAL holds a byte of a deleted user's text (before: 4,571 copies of the marker) or of a
    deleted exchange; another user's marker is there (the scan sees text)."""
    db = tmp_path / "m.db"
    with open_memory(db) as m:
        _fill(m, "alice", "zebracornalice", 60)
        _fill(m, "bob", "zebracornbob", 20)
        m.consolidate("alice")
        m.recall("zebracornalice bread", user_id="alice")
        victim = m.add(turn("bike repair secretmarkerbob question", "secretmarkerbob reply"),
                       user_id="bob", session_id="s")
        m.add(turn("bike repair follow up", "more"), user_id="bob", session_id="s")
        assert b"zebracornalice" in _files(db)
        # Also on SQLite builds whose default is off (the file after close kept the text).
        assert m.store._conn.execute("PRAGMA secure_delete").fetchone()[0] == 1
        assert m.delete_user("alice") == 60
        m.delete(victim.id)
        raw = _files(db)
        assert b"zebracornbob" in raw
        assert raw.count(b"zebracornalice") == 0
        assert raw.count(b"secretmarkerbob") == 0
        # The memory goes on working after the purge.
        m.add(turn("bread baking again", "ok"), user_id="bob", session_id="s")
        assert m.recall("bread", user_id="bob").exchanges


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


def test_forget_topic_leaves_no_bytes_behind(tmp_path: Path) -> None:
    """Forgetting a topic whose very title is made of the forgotten words: neither the text,
    nor the title, nor the log of the forget keeps them."""
    db = tmp_path / "m.db"
    with open_memory(db) as m:
        _fill(m, "carol", "plainword")
        victims = [m.add(turn(f"quokkasecret habitat quokkasecret diet {i}", f"quokkasecret reply {i}"),
                         user_id="carol", session_id="q").id for i in range(4)]
        topic = m.get(victims[0]).topic_id
        assert topic is not None and "quokkasecret" in m.topic(topic, user_id="carol").title.lower()
        report = m.forget_topic(topic, user_id="carol", confirm=True)
        assert set(victims) <= set(report.exchange_ids)
        from arbormem.check import check

        assert check(m).ok
    _compact(db)
    raw = _bytes(db)
    assert b"plainword" in raw
    assert b"quokkasecret" not in raw.lower()


def test_no_public_read_returns_another_users_data(tmp_path: Path) -> None:
    """Every read of the library API, given alice's user id, answers from alice's data only;
    bob's ids used through alice's scope are not found (not silently served)."""
    import json as _json

    import pytest

    from arbormem.errors import NotFoundError

    with open_memory(tmp_path / "m.db") as m:
        _fill(m, "alice", "zebracornalice", 12)
        bob_ids = _fill(m, "bob", "zebracornbob", 12)
        m.consolidate("alice")
        m.consolidate("bob")
        bob_topic = m.get(bob_ids[0]).topic_id
        assert bob_topic is not None
        recalled = m.recall("zebracornbob bread bike chess", user_id="alice", max_tokens=4000).to_dict()
        recalled.pop("trace")  # it echoes the query, which names bob's marker
        answers = [
            recalled,
            [h.to_dict() for h in m.search("zebracornbob bread", user_id="alice", limit=50)],
            [e.to_dict() for e in m.exchanges(user_id="alice")],
            [t.to_dict() for t in m.topics(user_id="alice")],
            m.tree(user_id="alice").to_dict(),
            [c.to_dict() for c in m.history(bob_ids[0], user_id="alice")],
        ]
        blob = _json.dumps(answers, default=str, ensure_ascii=False)
        assert "zebracornalice" in blob and "zebracornbob" not in blob
        assert bob_topic not in blob and bob_ids[0] not in blob
        for call in (lambda: m.topic(bob_topic, user_id="alice"),
                     lambda: m.read(bob_topic, user_id="alice"),
                     lambda: m.set_recall_mode(bob_topic, "both", user_id="alice"),
                     lambda: m.topic_detail(bob_topic, user_id="alice")):
            with pytest.raises(NotFoundError):
                call()
        assert m.stats(user_id="alice").completed == 12


def test_postgres_deletion_leaves_no_row_with_the_text(pg_database: str) -> None:
    """PostgreSQL: after delete_user and delete, no row of any arbormem table holds the deleted
    words (the term statistics dropped their zero counts too); another user's words remain.
    Dead tuples are PostgreSQL's own to reclaim (VACUUM), see docs/robustness.md."""
    import psycopg

    from arbormem import Memory

    with Memory(database_url=pg_database, embedder="hash") as m:
        _fill(m, "alice", "zebracornalice", 12)
        _fill(m, "bob", "zebracornbob", 12)
        victim = m.add(turn("bike repair secretmarkerbob question", "secretmarkerbob reply"),
                       user_id="bob", session_id="s")
        m.add(turn("bike repair follow up", "more"), user_id="bob", session_id="s")
        m.delete_user("alice")
        m.delete(victim.id)
    with psycopg.connect(pg_database) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE 'arbormem%'")]
        found: dict[str, int] = {}
        for marker in ("zebracornalice", "secretmarkerbob", "zebracornbob"):
            found[marker] = sum(conn.execute(
                f"SELECT count(*) FROM {t} x WHERE x::text LIKE %s", (f"%{marker}%",)).fetchone()[0]
                for t in tables)
        zero = conn.execute("SELECT count(*) FROM arbormem_term_df WHERE df <= 0").fetchone()[0]
    assert found["zebracornbob"] > 0
    assert found["zebracornalice"] == 0 and found["secretmarkerbob"] == 0
    assert zero == 0
