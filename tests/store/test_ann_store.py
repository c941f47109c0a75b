"""SQLiteStore's approximate vector search above ``ann_threshold`` (``store/ann.py``): the
switch, consistency with the stored vectors through writes, deletes, reopening, corrupt or
stale graph files and a process killed while saving the graph. Real SQLite files, real usearch.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("usearch", reason="approximate search needs usearch (pip install 'arbormem[ann]')")

from arbormem.store.ann import AnnMirror  # noqa: E402
from arbormem.store.sqlite import SQLiteStore  # noqa: E402

from .test_ann import clustered  # noqa: E402

DIM = 32
U = "alice"


def ids_of(n: int, start: int = 0) -> list[str]:
    return [f"e{i}" for i in range(start, start + n)]


def exact_top(vectors: dict[str, np.ndarray], q: np.ndarray, k: int) -> list[str]:
    ids = list(vectors)
    scores = np.stack([vectors[i] for i in ids]) @ q
    return [ids[j] for j in np.argsort(-scores)[:k]]


def recall(store: SQLiteStore, vectors: dict[str, np.ndarray], queries: np.ndarray, k: int = 10) -> float:
    got = [len({i for i, _ in store.vector_search(U, "exchange", q, k)} & set(exact_top(vectors, q, k))) / k
           for q in queries]
    return float(np.mean(got))


def mirror(store: SQLiteStore) -> AnnMirror:
    return store._ann[(U, "exchange")].mirror


def graph_file(db: Path) -> Path:
    (path,) = (db.parent / (db.name + ".ann")).glob("*-exchange.usearch")
    return path


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "memory.db"


def fill(store: SQLiteStore, n: int, start: int = 0, draw: int = 0) -> dict[str, np.ndarray]:
    vecs = clustered(n, dim=DIM, centres=40, draw=draw)
    ids = ids_of(n, start)
    store.put_vectors(U, "exchange", ids, vecs)
    return dict(zip(ids, vecs, strict=True))


QUERIES = clustered(40, dim=DIM, centres=40, draw=99)


def test_exact_below_the_threshold_graph_above_it(db: Path) -> None:
    store = SQLiteStore(db, ann_threshold=1000)
    vectors = fill(store, 600)
    first = store.vector_search(U, "exchange", QUERIES[0], 10)
    assert store._ann == {}  # below the threshold: exact, no graph
    assert [i for i, _ in first] == exact_top(vectors, QUERIES[0], 10)
    vectors |= fill(store, 900, start=600, draw=1)
    assert recall(store, vectors, QUERIES) >= 0.95
    assert mirror(store).n == 1500 and mirror(store).rebuilds == 1
    # scores are the exact cosines, best first, as on the exact path
    hits = store.vector_search(U, "exchange", QUERIES[1], 10)
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    for item, score in hits:
        assert score == pytest.approx(float(vectors[item] @ QUERIES[1]), abs=1e-5)
    assert len(store.vector_search(U, "exchange", QUERIES[1], 5000)) == 1500
    store.close()
    assert graph_file(db).stat().st_size > 0

    never = SQLiteStore(db, ann_threshold=None)  # None (or 0): never a graph
    assert recall(never, vectors, QUERIES) == 1.0 and never._ann == {}
    never.close()


def test_exact_search_of_a_big_partition_keeps_no_transposed_copy(db: Path) -> None:
    """Exact search of a partition at or past the ANN threshold (while its graph loads, or
    through a filter) scores the rows in place: copying a 1M-row matrix made a cold open's
    first recall 10.8 s (BENCHMARKS.md). A copy made while the partition was small goes."""
    store = SQLiteStore(db, ann_threshold=1000)
    vectors = fill(store, 600)
    cache = store._refresh(U, "exchange", DIM)
    assert [i for i, _ in store.vector_search(U, "exchange", QUERIES[0], 10)] == exact_top(vectors, QUERIES[0], 10)
    assert cache.cols is not None  # small: the transposed copy serves exact search
    vectors |= fill(store, 900, start=600, draw=1)
    cache = store._refresh(U, "exchange", DIM)
    for q in QUERIES[:5]:
        scores = store._exact_scores(cache, q, cache.n)
        assert cache.cols is None and cache.cols_n == 0
        want = np.stack([vectors[i] for i in cache.ids[: cache.n]]) @ q
        assert np.allclose(scores, want, atol=1e-5)
    store.close()


def test_in_memory_store_uses_a_graph_without_files(tmp_path: Path) -> None:
    store = SQLiteStore(":memory:", ann_threshold=300)
    vectors = fill(store, 800)
    assert recall(store, vectors, QUERIES) >= 0.95 and mirror(store).n == 800
    store.close()
    assert list(tmp_path.iterdir()) == []


def test_graph_follows_puts_overwrites_and_deletes(db: Path) -> None:
    store = SQLiteStore(db, ann_threshold=500)
    other = SQLiteStore(db, ann_threshold=None)  # another writer on the same file
    vectors = fill(store, 1200)
    assert recall(store, vectors, QUERIES) >= 0.95
    # overwrite: e5 now sits where a query is, e6 elsewhere (upserts keep their rowids)
    store.put_vectors(U, "exchange", ["e5"], QUERIES[2][None, :])
    vectors["e5"] = QUERIES[2]
    assert store.vector_search(U, "exchange", QUERIES[2], 1) == [("e5", pytest.approx(1.0, abs=1e-5))]
    # new rows, from this store and from the other one
    vectors |= fill(store, 100, start=1200, draw=2)
    vectors |= fill(other, 100, start=1300, draw=3)
    assert recall(store, vectors, QUERIES) >= 0.95
    assert store.vector_search(U, "exchange", vectors["e1350"], 1)[0][0] == "e1350"
    # deletes, here and by the other writer: never returned again
    for item in ("e5", "e1350"):
        store.delete_index("exchange", item)
        del vectors[item]
    other.delete_index("exchange", "e7")
    del vectors["e7"]
    for q in (QUERIES[2], clustered(1, dim=DIM, centres=40, draw=3)[0]):
        assert {i for i, _ in store.vector_search(U, "exchange", q, 50)}.isdisjoint({"e5", "e7", "e1350"})
    assert recall(store, vectors, QUERIES) >= 0.95
    assert mirror(store).rebuilds == 1  # deletions patched the graph, no rebuild
    assert len(mirror(store).index) == len(vectors) == mirror(store).n
    store.close()
    other.close()


def test_searches_from_threads_while_writing(db: Path) -> None:
    store = SQLiteStore(db, ann_threshold=500)
    vectors = fill(store, 1000)
    errors: list[BaseException] = []
    stop = threading.Event()

    def search() -> None:
        try:
            while not stop.is_set():
                for q in QUERIES[:5]:
                    hits = store.vector_search(U, "exchange", q, 10)
                    assert len(hits) == 10
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=search) for _ in range(3)]
    for t in threads:
        t.start()
    for b in range(10):
        vectors |= fill(store, 30, start=1000 + 30 * b, draw=20 + b)
        store.put_vectors(U, "exchange", [f"e{b}"], QUERIES[10 + b][None, :])
        vectors[f"e{b}"] = QUERIES[10 + b]
        store.delete_index("exchange", f"e{100 + b}")
        del vectors[f"e{100 + b}"]
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    assert recall(store, vectors, QUERIES) >= 0.95
    for b in range(10):
        assert store.vector_search(U, "exchange", QUERIES[10 + b], 1)[0][0] == f"e{b}"
    assert len(mirror(store).index) == len(vectors)
    store.close()


def test_partition_shrinking_below_the_threshold_is_searched_exactly(db: Path) -> None:
    store = SQLiteStore(db, ann_threshold=500)
    vectors = fill(store, 520)
    store.vector_search(U, "exchange", QUERIES[0], 10)
    assert (U, "exchange") in store._ann
    for item in ids_of(30):
        store.delete_index("exchange", item)
        del vectors[item]
    assert [i for i, _ in store.vector_search(U, "exchange", QUERIES[0], 10)] == exact_top(vectors, QUERIES[0], 10)
    assert store._ann == {}
    vectors |= fill(store, 30, start=520, draw=10)  # grows back: the saved graph is caught up
    assert recall(store, vectors, QUERIES) >= 0.95
    assert mirror(store).rebuilds == 0 and mirror(store).n == 520
    store.close()


def test_graph_persists_across_reopen_and_catches_up(db: Path) -> None:
    store = SQLiteStore(db, ann_threshold=500)
    vectors = fill(store, 1000)
    before = [store.vector_search(U, "exchange", q, 10) for q in QUERIES]
    store.close()
    mtime = graph_file(db).stat().st_mtime_ns

    again = SQLiteStore(db, ann_threshold=500)
    assert [again.vector_search(U, "exchange", q, 10) for q in QUERIES] == before
    assert mirror(again).rebuilds == 0 and mirror(again).repaired == 0  # loaded, all current
    again.close()
    assert graph_file(db).stat().st_mtime_ns == mtime  # unchanged graph: not rewritten

    # rows written while no store with a graph was open are added on the next load
    plain = SQLiteStore(db, ann_threshold=None)
    vectors |= fill(plain, 50, start=1000, draw=4)
    plain.close()
    third = SQLiteStore(db, ann_threshold=500)
    assert recall(third, vectors, QUERIES) >= 0.95
    assert mirror(third).rebuilds == 0 and mirror(third).n == 1050
    third.close()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "missing_meta", "foreign"])
def test_damaged_graph_file_is_rebuilt(db: Path, damage: str) -> None:
    store = SQLiteStore(db, ann_threshold=500)
    vectors = fill(store, 1000)
    store.vector_search(U, "exchange", QUERIES[0], 10)
    store.close()
    path = graph_file(db)
    if damage == "garbage":
        path.write_bytes(os.urandom(path.stat().st_size))
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:1000])
    elif damage == "missing_meta":
        path.with_name(path.name + ".json").unlink()
    else:  # another partition's graph copied over this one
        bob = SQLiteStore(db, ann_threshold=500)
        bob.put_vectors("bob", "exchange", [f"b{i}" for i in range(600)], clustered(600, dim=DIM, draw=6))
        bob.vector_search("bob", "exchange", QUERIES[0], 10)
        bob.close()
        (foreign,) = [p for p in path.parent.glob("*-exchange.usearch") if p != path]
        foreign.replace(path)
        foreign.with_name(foreign.name + ".json").replace(path.with_name(path.name + ".json"))

    again = SQLiteStore(db, ann_threshold=500)
    assert recall(again, vectors, QUERIES) >= 0.95
    assert mirror(again).rebuilds == 1
    again.close()
    assert SQLiteStore(db, ann_threshold=500).vector_search(U, "exchange", QUERIES[0], 1)


def test_graph_stale_after_changes_behind_its_back(db: Path) -> None:
    store = SQLiteStore(db, ann_threshold=500)
    vectors = fill(store, 1000)
    store.vector_search(U, "exchange", QUERIES[0], 10)
    store.close()
    # Another program rewrites the database: an upsert in place (same rowid), a deletion
    # without telling anyone, a new row. The saved graph's own checks all still pass.
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE vectors SET vec = ? WHERE item_id = 'e10'", (QUERIES[3].tobytes(),))
        conn.execute("DELETE FROM vectors WHERE item_id = 'e11'")
        conn.execute("INSERT INTO vectors (kind, item_id, user_id, vec) VALUES ('exchange', 'x', ?, ?)",
                     (U, QUERIES[4].tobytes()))
    conn.close()
    vectors["e10"], vectors["x"] = QUERIES[3], QUERIES[4]
    del vectors["e11"]

    again = SQLiteStore(db, ann_threshold=500)
    assert again.vector_search(U, "exchange", QUERIES[3], 1)[0][0] == "e10"
    assert again.vector_search(U, "exchange", QUERIES[4], 1)[0][0] == "x"
    assert mirror(again).rebuilds == 0 and mirror(again).repaired == 2  # e10 re-added, e11 gone
    assert recall(again, vectors, QUERIES) >= 0.95
    again.close()

    # most vectors re-embedded behind its back (another model): cheaper to rebuild than patch
    fresh = clustered(1000, dim=DIM, centres=40, draw=11)
    conn = sqlite3.connect(db)
    with conn:
        conn.executemany("UPDATE vectors SET vec = ? WHERE item_id = ?",
                         [(v.tobytes(), f"e{i}") for i, v in enumerate(fresh) if f"e{i}" in vectors])
    conn.close()
    vectors = {i: (fresh[int(i[1:])] if i != "x" else v) for i, v in vectors.items()}
    third = SQLiteStore(db, ann_threshold=500)
    assert recall(third, vectors, QUERIES) >= 0.95
    assert mirror(third).rebuilds == 1
    third.close()


def test_delete_user_removes_the_graph_files(db: Path) -> None:
    store = SQLiteStore(db, ann_threshold=500)
    fill(store, 600)
    store.vector_search(U, "exchange", QUERIES[0], 10)
    assert graph_file(db).exists()
    store.delete_user(U)
    assert store.vector_search(U, "exchange", QUERIES[0], 10) == []
    store.close()
    assert list((db.parent / (db.name + ".ann")).iterdir()) == []


def test_without_usearch_the_store_stays_exact(db: Path) -> None:
    store = SQLiteStore(db, ann_threshold=None)
    vectors = fill(store, 600)
    store.close()
    script = textwrap.dedent("""
        import sys
        sys.modules["usearch"] = sys.modules["usearch.index"] = None  # as if not installed
        import numpy as np
        from arbormem.store.sqlite import SQLiteStore
        store = SQLiteStore(sys.argv[1], ann_threshold=100)
        q = np.frombuffer(bytes.fromhex(sys.argv[2]), dtype=np.float32)
        print(" ".join(i for i, _ in store.vector_search("alice", "exchange", q, 10)))
        assert store._ann == {}
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", script, str(db), QUERIES[0].tobytes().hex()],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == exact_top(vectors, QUERIES[0], 10)
    assert "usearch is not installed" in out.stderr


CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from arbormem.store.sqlite import SQLiteStore

    store = SQLiteStore(sys.argv[1], ann_threshold=500)
    store.vector_search("alice", "exchange", np.ones(32, dtype=np.float32) / 32 ** 0.5, 10)
    slot = store._ann[("alice", "exchange")]
    print("ready", flush=True)
    while True:  # save over and over, so the kill lands inside a save
        slot.mirror.changes = 1
        store._save_ann(force=True)
""")


def test_sigkill_while_saving_the_graph_leaves_a_working_store(db: Path) -> None:
    store = SQLiteStore(db, ann_threshold=500)
    vectors = fill(store, 2000)
    store.vector_search(U, "exchange", QUERIES[0], 10)
    store.close()
    ann_dir = db.parent / (db.name + ".ann")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    torn = 0
    for _ in range(2):
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(db)], stdout=subprocess.PIPE, env=env)
        assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
        deadline = time.monotonic() + 10
        while not list(ann_dir.glob("*.tmp")) and time.monotonic() < deadline:
            time.sleep(0.0005)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        torn += bool(list(ann_dir.glob("*.tmp")))
        again = SQLiteStore(db, ann_threshold=500)
        assert recall(again, vectors, QUERIES) >= 0.95
        assert mirror(again).n == 2000 and len(mirror(again).index) == 2000
        again.close()
    assert torn >= 1  # at least one kill left a save half done
    # leftovers of the killed saves are cleaned up by the next save
    final = SQLiteStore(db, ann_threshold=500)
    final.vector_search(U, "exchange", QUERIES[0], 10)
    mirror(final).changes = 1
    final.close()
    assert not list(ann_dir.glob("*.tmp"))


def test_large_graph_work_runs_in_the_background(db: Path) -> None:
    store = SQLiteStore(db, ann_threshold=500)
    store._ann_background_rows = 1000  # 20k in production: scaled down to the test's size
    vectors = fill(store, 4000)
    # the first search starts the build and answers exactly, without waiting for it
    assert [i for i, _ in store.vector_search(U, "exchange", QUERIES[0], 10)] == exact_top(vectors, QUERIES[0], 10)
    slot = store._ann[(U, "exchange")]
    deadline = time.monotonic() + 60
    while slot.building and time.monotonic() < deadline:
        assert recall(store, vectors, QUERIES[:2]) == 1.0  # exact meanwhile
        time.sleep(0.01)
    assert not slot.building and slot.mirror.n == 4000
    assert graph_file(db).exists()  # the builder saved it
    assert recall(store, vectors, QUERIES) >= 0.95
    # a few new rows are added inline; a big batch goes to the background again
    vectors |= fill(store, 10, start=4000, draw=7)
    store.vector_search(U, "exchange", QUERIES[0], 10)
    assert not slot.building and slot.mirror.n == 4010
    vectors |= fill(store, 1500, start=4010, draw=8)
    store.vector_search(U, "exchange", QUERIES[0], 10)
    while slot.building and time.monotonic() < deadline:
        time.sleep(0.01)
    assert slot.mirror.n == 5510 and recall(store, vectors, QUERIES) >= 0.95
    store.close()
