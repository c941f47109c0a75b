"""SQLiteStore's vector snapshot: a large partition's vector cache saved beside the database
at close and read back on the next open instead of every row, trusted only while SQLite still
holds the same rows (deletion generation, rewrite count, row count, highest rowid and its row);
and its 8-bit copy, which picks the candidates of searches before the graph is ready."""

from __future__ import annotations

import json
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
    s._coarse_rows = 100  # 50k
    return s


def snapshot_files(db: Path) -> list[Path]:
    return sorted((db.parent / (db.name + ".ann")).glob("*-exchange.vectors*"))


@pytest.fixture
def filled(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    db = tmp_path / "m.db"
    s = store_at(db)
    vecs = clustered(300, dim=DIM, centres=10)
    ids = [f"e{i}" for i in range(300)]
    s.put_vectors(U, "exchange", ids[:150], vecs[:150])
    s.put_vectors("bob", "exchange", ["b0"], vecs[:1])  # leaves a free rowid, 151, once deleted
    s.put_vectors(U, "exchange", ids[150:], vecs[150:])
    s.delete_index("exchange", "b0")
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
    assert len(snapshot_files(db)) == 6  # rows, their 8-bit copy and scales, rowids, ids, watermark
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
    assert len(snapshot_files(db)) == 6  # the old token's files are gone


@pytest.mark.parametrize("change", ["update", "delete", "delete_insert", "insert_below", "store_delete", "torn"])
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
            elif change == "insert_below":  # into a gap below the highest rowid: rowids alone miss it
                conn.execute("INSERT INTO vectors (rid, kind, item_id, user_id, vec) VALUES (151, 'exchange', 'x', ?, ?)",
                             (U, q.tobytes()))
                vectors["x"] = q
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
    assert s._exec("SELECT count(*) FROM meta WHERE key LIKE 'vectors%:' || ?", (U,)).fetchone()[0] == 0
    s.close()


# -- the 8-bit copy --------------------------------------------------------------------------

BIG = 3000  # rows: ten times the 400 candidates a top-10 search re-scores


@pytest.fixture
def big(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    db = tmp_path / "m.db"
    s = store_at(db)
    vecs = clustered(BIG, dim=DIM, centres=40)
    ids = [f"e{i}" for i in range(BIG)]
    s.put_vectors(U, "exchange", ids, vecs)
    s.vector_search(U, "exchange", vecs[0], 5)
    s.close()
    return db, dict(zip(ids, vecs, strict=True))


def file_of(db: Path, suffix: str) -> Path:
    (path,) = [p for p in snapshot_files(db) if p.name.endswith(suffix)]
    return path


def exact(vectors: dict[str, np.ndarray], q: np.ndarray, k: int) -> list[tuple[str, float]]:
    return [(i, float(vectors[i] @ q)) for i in top(vectors, q, k)]


def same(got: list[tuple[str, float]], want: list[tuple[str, float]]) -> None:
    assert [i for i, _ in got] == [i for i, _ in want]
    assert [sc for _, sc in got] == pytest.approx([sc for _, sc in want], abs=1e-6)


def test_eight_bit_candidates_exact_scores(big: tuple[Path, dict[str, np.ndarray]]) -> None:
    db, vectors = big
    s = store_at(db)
    for draw in range(1, 6):
        q = clustered(1, dim=DIM, centres=40, draw=draw)[0]
        same(s.vector_search(U, "exchange", q, 10), exact(vectors, q, 10))
    cache = s._cache[(U, "exchange")]
    assert cache.codes is not None and used(s)
    s.close()


def test_eight_bit_copy_only_picks_candidates(big: tuple[Path, dict[str, np.ndarray]]) -> None:
    """The copy is read, and trusted only to choose rows: zeroing the best row's codes hides it
    from the search (so the copy is what ranked), and every score returned is the float32 one."""
    db, vectors = big
    q = clustered(1, dim=DIM, centres=40, draw=9)[0]
    best = top(vectors, q, 1)[0]
    row = list(vectors).index(best)
    codes = np.load(file_of(db, ".i8.npy"), mmap_mode="r+")
    codes[row] = 0
    codes.flush()
    del codes
    s = store_at(db)
    got = s.vector_search(U, "exchange", q, 10)
    assert best not in [i for i, _ in got]
    assert all(sc == pytest.approx(float(vectors[i] @ q), abs=1e-6) for i, sc in got)
    s.close()


def test_rows_written_after_the_load_are_searched_exactly(big: tuple[Path, dict[str, np.ndarray]]) -> None:
    db, vectors = big
    s = store_at(db)
    q = clustered(1, dim=DIM, centres=40, draw=11)[0]
    s.vector_search(U, "exchange", q, 10)  # loads the snapshot
    # e7 rewritten in place (its 8-bit row is now stale) and a new row appended after the copy
    s.put_vectors(U, "exchange", ["e7", "fresh"], np.stack([q, -q]))
    vectors["e7"], vectors["fresh"] = q, -q
    assert s._cache[(U, "exchange")].code_stale == {7}
    same(s.vector_search(U, "exchange", q, 10), exact(vectors, q, 10))
    assert s.vector_search(U, "exchange", -q, 1)[0][0] == "fresh"
    s.close()


def test_a_snapshot_without_the_copy_is_used_then_saved_with_it(
        big: tuple[Path, dict[str, np.ndarray]]) -> None:
    """Snapshots saved before the 8-bit copy existed are read as before and written again, with
    the copy, at the next close."""
    db, vectors = big
    meta = db.parent / (db.name + ".ann") / next(p.name for p in snapshot_files(db) if p.name.endswith(".json"))
    info = json.loads(meta.read_text())
    info["format"] = 1  # as saved before it
    meta.write_text(json.dumps(info))
    file_of(db, ".i8.npy").unlink()
    file_of(db, ".scale.npy").unlink()
    s = store_at(db)
    q = clustered(1, dim=DIM, centres=40, draw=13)[0]
    same(s.vector_search(U, "exchange", q, 10), exact(vectors, q, 10))
    assert s._cache[(U, "exchange")].codes is None
    s.close()
    assert len(snapshot_files(db)) == 6
    again = store_at(db)
    same(again.vector_search(U, "exchange", q, 10), exact(vectors, q, 10))
    assert again._cache[(U, "exchange")].codes is not None and used(again)
    again.close()


@pytest.mark.parametrize("damage", ["truncated", "shape", "last_row"])
def test_a_damaged_copy_is_not_used(big: tuple[Path, dict[str, np.ndarray]], damage: str) -> None:
    db, vectors = big
    codes_file = file_of(db, ".i8.npy")
    if damage == "truncated":
        codes_file.write_bytes(codes_file.read_bytes()[:-100])
    elif damage == "shape":
        np.save(file_of(db, ".scale.npy"), np.ones(BIG - 1, dtype=np.float32))
    else:  # the newest row's codes, which the load compares with SQLite's vector
        codes = np.load(codes_file, mmap_mode="r+")
        codes[BIG - 1] = -codes[BIG - 1]
        codes.flush()
        del codes
    s = store_at(db)
    q = clustered(1, dim=DIM, centres=40, draw=15)[0]
    same(s.vector_search(U, "exchange", q, 10), exact(vectors, q, 10))
    assert not used(s)  # read from SQLite instead
    s.close()
