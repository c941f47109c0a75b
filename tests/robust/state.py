"""A digest of everything a SQLite memory stores, to prove a rejected call changed nothing."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

TABLES = ("meta", "user_state", "exchanges", "topics", "vectors", "term_df", "changes")


def digest(db: Path) -> str:
    """SHA-256 over every row of every table and full-text index, read from the file by a
    separate connection (so it sees what is committed, not what a connection caches)."""
    h = hashlib.sha256()
    conn = sqlite3.connect(db)
    try:
        for table in TABLES:
            for row in conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2"):
                h.update(repr(row).encode("utf-8", "surrogatepass"))
        for fts in ("exchange_fts", "topic_fts"):
            for row in conn.execute(f"SELECT rowid, uid, body FROM {fts} ORDER BY rowid"):
                h.update(repr(row).encode("utf-8", "surrogatepass"))
    finally:
        conn.close()
    return h.hexdigest()
