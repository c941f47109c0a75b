"""The HNSW mirror used for approximate search in the embedded store (``store/ann.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("usearch", reason="approximate search needs usearch (pip install 'arbormem[ann]')")

from arbormem.store.ann import AnnIndex, AnnMirror  # noqa: E402


def clustered(n: int, dim: int = 384, centres: int = 200, seed: int = 3, draw: int = 0) -> np.ndarray:
    """Unit vectors in clusters, like sentence embeddings; ``draw`` picks other members of the
    same clusters (queries resemble the stored texts, as they do in a memory)."""
    c = np.random.default_rng(seed).normal(size=(centres, dim)).astype(np.float32)
    rng = np.random.default_rng((seed, draw))
    m = c[rng.integers(0, centres, n)] + 0.6 * rng.normal(size=(n, dim)).astype(np.float32)
    return (m / np.linalg.norm(m, axis=1, keepdims=True)).astype(np.float32)


class Owner:  # stands in for SQLiteStore's _VecCache
    pass


def keys_of(n: int, start: int = 1) -> np.ndarray:
    # rowids: increasing, not starting at 0, with gaps (other partitions' rows)
    return np.arange(start, start + 3 * n, 3, dtype=np.int64)


def test_recall_at_10_matches_exact_search() -> None:
    data = clustered(5_000)
    queries = clustered(100, draw=1)
    mirror = AnnMirror(384)
    mirror.sync(Owner(), keys_of(5_000), data, len(data))
    exact = np.argsort(-(queries @ data.T), axis=1)[:, :10]
    recall = np.mean([
        len({r for r, _ in mirror.search(q, 10)} & set(e.tolist())) / 10
        for q, e in zip(queries, exact, strict=True)
    ])
    assert recall >= 0.97
    # scores are exact cosines of the returned rows, best first
    hits = mirror.search(queries[0], 10)
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    for row, score in hits:
        assert score == pytest.approx(float(data[row] @ queries[0]), abs=1e-5)


def test_mirror_follows_growth_patches_and_rebuilt_caches() -> None:
    data = clustered(300, dim=32)
    keys = keys_of(300)
    owner = Owner()
    mirror = AnnMirror(32)
    mirror.sync(owner, keys, data, 200)
    assert mirror.n == 200 and len(mirror.index) == 200
    assert all(r < 200 for r, _ in mirror.search(data[250], 20))
    mirror.sync(owner, keys, data, 300)  # new rows appended to the cache
    assert mirror.search(data[250], 1)[0][0] == 250
    assert mirror.rebuilds == 1
    # an upsert overwrote row 7 in place
    data[7] = data[123]
    mirror.sync(owner, keys, data, 300, changed=[7, 999])  # rows not mirrored are ignored
    assert {r for r, _ in mirror.search(data[123], 2)} == {7, 123}
    assert len(mirror.index) == 300
    # row 8 was re-inserted under a new rowid (the largest so far), with a new vector
    keys = keys.copy()
    keys[8] = 10_000
    data[8] = data[200]
    mirror.sync(owner, keys, data, 300, changed=[8])
    assert {r for r, _ in mirror.search(data[200], 2)} == {8, 200}
    assert len(mirror.index) == 300 and mirror.tombstones == 1
    # The cache was rebuilt without rows 0-9 (deleted) and row 20 changed behind our back:
    # the graph is patched key by key, not rebuilt, and rows are renumbered.
    data2 = data[10:].copy()
    data2[10] = clustered(1, dim=32, draw=9)[0]  # the former row 20
    mirror.sync(Owner(), keys[10:], data2, 290)
    assert mirror.rebuilds == 1 and mirror.repaired == 11 and len(mirror.index) == 290
    assert mirror.search(data2[-1], 1)[0][0] == 289
    assert mirror.search(data2[10], 1) == [(10, pytest.approx(1.0, abs=1e-5))]
    assert all(r < 290 for r, _ in mirror.search(data[0], 300))
    # a cache that lost most rows: cheaper to rebuild than to tombstone
    mirror.sync(Owner(), keys[250:], data[250:], 50)
    assert mirror.rebuilds == 2 and len(mirror.index) == 50
    assert mirror.search(data[0], 0) == []


def test_saved_graph_is_checked_against_the_vectors(tmp_path: Path) -> None:
    data = clustered(500, dim=16)
    keys = keys_of(500)
    mirror = AnnMirror(16)
    mirror.sync(Owner(), keys, data, 500)
    path = tmp_path / "ann" / "u-exchange.usearch"
    mark = {"user": "u", "kind": "exchange"}
    mirror.save(path, mark)
    assert mirror.changes == 0

    again = AnnMirror(16)
    assert again.load(path, mark)
    data[42] = data[7]  # changed since the save (an upsert keeps the rowid)
    again.sync(Owner(), keys, data, 500)
    assert again.rebuilds == 0 and again.repaired == 1
    assert {r for r, _ in again.search(data[7], 2)} == {7, 42}

    assert not AnnMirror(16).load(path, {**mark, "user": "v"})  # another partition's file
    assert not AnnMirror(8).load(path, mark)
    assert not AnnMirror(16).load(tmp_path / "missing.usearch", mark)
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) // 2])  # torn write
    assert not AnnMirror(16).load(path, mark)
    path.write_bytes(b"not a graph")  # garbage
    assert not AnnMirror(16).load(path, mark)
    AnnIndex.discard(path)
    assert list(path.parent.iterdir()) == []


def saved_graph(tmp_path: Path, n: int) -> tuple[np.ndarray, np.ndarray, Path, dict[str, str]]:
    """A graph of ``n`` 8-d rows saved under ``tmp_path``: its vectors, keys, file, watermark."""
    data = clustered(n, dim=8)
    keys = keys_of(n)
    mirror = AnnMirror(8)
    mirror.sync(Owner(), keys, data, n)
    path = tmp_path / "g.usearch"
    mark = {"user": "u", "kind": "exchange"}
    mirror.save(path, mark)
    return data, keys, path, mark


def test_check_of_a_loaded_graph_spans_its_batches(tmp_path: Path) -> None:
    """The stored vectors are checked a batch at a time (``_GET_CHUNK``): changes in the
    first and last batches are both found, and the loaded graph (read from memory, not by
    usearch from the path) still takes new rows."""
    from arbormem.store import ann

    n = ann._GET_CHUNK * 2 + 100
    data, keys, path, mark = saved_graph(tmp_path, n)
    blob, digest = ann._read_whole(path)
    assert digest == ann._file_digest(path) and blob.tobytes() == path.read_bytes()

    again = AnnMirror(8)
    assert again.load(path, mark)
    data[3] = data[5]
    data[n - 2] = data[9]
    grown = np.vstack([data, clustered(20, dim=8, draw=1)])
    more = keys_of(n + 20)
    again.sync(Owner(), more, grown, n + 20)
    assert again.rebuilds == 0 and again.repaired == 2
    assert len(again.index) == n + 20
    assert again.search(grown[n + 19], 1)[0][0] == n + 19
    assert {r for r, _ in again.search(data[9], 2)} == {9, n - 2}


def test_remove_and_empty_index() -> None:
    index = AnnIndex(8)
    assert index.search(np.ones(8, dtype=np.float32), 5) == []
    data = clustered(10, dim=8)
    index.add(range(10), data)
    index.remove([3])
    assert 3 not in {k for k, _ in index.search(data[3], 10)}
    assert len(index.search(data[0], 50)) == 9
    gone, stale = index.stale_keys(np.array([0, 1, 2, 4, 11]), data[[0, 5, 2, 4, 6]])
    assert sorted(gone.tolist()) == [5, 6, 7, 8, 9] and stale.tolist() == [1]


def test_background_graph_work_waits_for_running_searches() -> None:
    """``SearchGate``: a pause returns at once with no search running, waits while one runs
    and returns when it ends, and never waits more than its total in all."""
    import threading
    import time

    from arbormem.store.ann import SearchGate

    gate = SearchGate()
    pause = gate.pauser(step=30.0, total=30.0)
    t0 = time.monotonic()
    pause()
    assert time.monotonic() - t0 < 0.5

    done = threading.Event()

    def background() -> None:
        pause()
        done.set()

    with gate.searching():
        worker = threading.Thread(target=background)
        worker.start()
        assert not done.wait(0.3)  # waiting for the search
    assert done.wait(5.0)  # the search ended
    worker.join()

    bounded = gate.pauser(step=30.0, total=0.2)
    with gate.searching():
        t0 = time.monotonic()
        bounded()
        bounded()  # the total is spent: no more waiting
        assert 0.15 < time.monotonic() - t0 < 5.0


def test_loading_a_graph_pauses_between_its_steps(tmp_path: Path) -> None:
    from arbormem.store import ann

    n = ann._GET_CHUNK + 10
    data, keys, path, mark = saved_graph(tmp_path, n)
    calls: list[int] = []
    again = AnnMirror(8)
    again.pause = lambda: calls.append(1)
    assert again.load(path, mark)
    read = len(calls)
    assert read >= 1  # reading the file (and usearch's progress, every 65,536 nodes)
    again.sync(Owner(), keys, data, n)
    assert len(calls) >= read + 2  # the check, a batch at a time
