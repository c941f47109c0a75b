"""SQLiteStore's vector snapshot: a large partition's vector cache saved beside the database
at close and read back on the next open instead of every row, trusted only while SQLite still
holds the same rows (deletion generation, rewrite count, row count, highest rowid and its row)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from arbormem.store.sqlite import SQLiteStore

from .test_ann import clustered

DIM = 16
U = "alice"


def store_at(db: Path) -> SQLiteStore:
    s = SQLiteStore(db, ann_threshold=None)
    s._ann_background_rows = 100  # 20k in production: scaled down to the test's size
    return s


def snapshot_files(db: Path) -> list[Path]:
    return sorted((db.parent / (db.name + ".ann")).glob("*-exchange.vectors*"))


@pytest.fixture
def filled(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    db = tmp_path / "m.db"
    s = store_at(db)
    vecs = clustered(300, dim=DIM, centres=10)
    ids = [f"e{i}" for i in range(300)]
    s.put_vectors(U, "exchange", ids, vecs)
    s.vector_search(U, "exchange", vecs[0], 5)
    s.close()
    return db, dict(zip(ids, vecs, strict=True))


def top(vectors: dict[str, np.ndarray], q: np.ndarray, k: int) -> list[str]:
    ids = list(vectors)
    return [ids[j] for j in np.argsort(-(np.stack(list(vectors.values())) @ q))[:k]]


def used(s: SQLiteStore) -> bool:
    return s._cache[(U, "exchange")].saved is not None


def test_saved_at_close_and_used_on_open(filled: tuple[Path, dict[str, np.ndarray]]) -> None:
    db, vectors = filled
    assert len(snapshot_files(db)) == 4  # rows, rowids, ids, watermark
    s = store_at(db)
    q = clustered(1, dim=DIM, centres=10, draw=5)[0]
    assert [i for i, _ in s.vector_search(U, "exchange", q, 10)] == top(vectors, q, 10)
    assert used(s)
    # rows added and rewritten through the store after the load: searched, then saved again
    s.put_vectors(U, "exchange", ["new", "e3"], np.stack([q, -q]))
    vectors["new"], vectors["e3"] = q, -q
    assert s.vector_search(U, "exchange", q, 1)[0][0] == "new"
    s.close()
    again = store_at(db)
    assert [i for i, _ in again.vector_search(U, "exchange", q, 10)] == top(vectors, q, 10)
    assert used(again)
    assert again.vector_search(U, "exchange", -q, 1)[0][0] == "e3"
    again.close()
    assert len(snapshot_files(db)) == 4  # the old token's files are gone


@pytest.mark.parametrize("change", ["update", "delete", "delete_insert", "store_delete", "torn"])
def test_changes_behind_its_back_are_seen(filled: tuple[Path, dict[str, np.ndarray]], change: str) -> None:
    db, vectors = filled
    q = clustered(1, dim=DIM, centres=10, draw=7)[0]
    if change == "store_delete":
        s = store_at(db)
        s.delete_index("exchange", "e5")
        s.close()
        del vectors["e5"]
    elif change == "torn":
        (rows,) = [p for p in snapshot_files(db) if p.name.endswith(".f32.npy")]
        rows.write_bytes(rows.read_bytes()[:-64])
    else:
        conn = sqlite3.connect(db)
        with conn:
            if change == "update":  # in place: same rowid, same count
                conn.execute("UPDATE vectors SET vec = ? WHERE item_id = 'e10'", (q.tobytes(),))
                vectors["e10"] = q
            else:
                conn.execute("DELETE FROM vectors WHERE item_id = 'e11'")
                del vectors["e11"]
                if change == "delete_insert":
                    conn.execute("INSERT INTO vectors (kind, item_id, user_id, vec) VALUES ('exchange', 'x', ?, ?)",
                                 (U, q.tobytes()))
                    vectors["x"] = q
        conn.close()
    s = store_at(db)
    assert [i for i, _ in s.vector_search(U, "exchange", q, 10)] == top(vectors, q, 10)
    assert not used(s)
    s.close()


def test_delete_user_removes_the_snapshot(filled: tuple[Path, dict[str, np.ndarray]]) -> None:
    db, _ = filled
    s = store_at(db)
    s.delete_user(U)
    assert snapshot_files(db) == []
    assert not any(k.startswith("vectors_rewritten") for k, _ in s.iter_meta())
    assert s._exec("SELECT count(*) FROM meta WHERE key LIKE 'vectors%'").fetchone()[0] == 0
    s.close()
