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


def test_recall_at_10_matches_exact_search() -> None:
    data = clustered(5_000)
    queries = clustered(100, draw=1)
    mirror = AnnMirror(384)
    mirror.sync(Owner(), data, len(data))
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


def test_mirror_follows_growth_patches_and_rebuilds() -> None:
    data = clustered(300, dim=32)
    owner = Owner()
    mirror = AnnMirror(32)
    mirror.sync(owner, data, 200)
    assert mirror.n == 200 and len(mirror.index) == 200
    assert all(r < 200 for r, _ in mirror.search(data[250], 20))
    mirror.sync(owner, data, 300)  # new rows appended to the cache
    assert mirror.search(data[250], 1)[0][0] == 250
    assert mirror.rebuilds == 1
    # an upsert overwrote row 7 in place
    data[7] = data[123]
    mirror.patch([7, 999], data[[7, 0]])  # rows not mirrored yet are ignored
    assert {r for r, _ in mirror.search(data[123], 2)} == {7, 123}
    assert len(mirror.index) == 300
    # the cache was rebuilt (another writer deleted vectors): a new owner means a new graph
    mirror.sync(Owner(), data[:50], 50)
    assert mirror.rebuilds == 2 and len(mirror.index) == 50
    assert mirror.search(data[250], 100)[0][0] < 50
    assert mirror.search(data[0], 0) == []


def test_saved_graph_is_reused_only_with_its_watermark(tmp_path: Path) -> None:
    data = clustered(500, dim=16)
    index = AnnIndex(16)
    index.add(np.arange(500), data)
    path = tmp_path / "ann" / "u-exchange-16.usearch"
    mark = {"max_rid": 500, "del_gen": 0, "n": 500}
    index.save(path, mark)
    loaded = AnnIndex.load(path, 16, mark)
    assert loaded is not None and len(loaded) == 500
    assert loaded.search(data[42], 1)[0][0] == 42
    assert AnnIndex.load(path, 16, {**mark, "del_gen": 1}) is None  # rows were deleted since
    assert AnnIndex.load(path, 8, mark) is None
    path.write_bytes(b"not a graph")  # torn or corrupted file: rebuild, never crash
    assert AnnIndex.load(path, 16, mark) is None
    assert AnnIndex.load(tmp_path / "missing.usearch", 16, mark) is None


def test_remove_and_empty_index() -> None:
    index = AnnIndex(8)
    assert index.search(np.ones(8, dtype=np.float32), 5) == []
    data = clustered(10, dim=8)
    index.add(range(10), data)
    index.remove([3])
    assert 3 not in {k for k, _ in index.search(data[3], 10)}
    assert len(index.search(data[0], 50)) == 9
