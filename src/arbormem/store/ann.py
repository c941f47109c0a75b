"""Approximate nearest-neighbour search for the embedded store, above a size threshold.

SQLiteStore's exact search multiplies the query with every vector of the partition: fine up
to tens of thousands of rows, linear beyond. Past ``ANN_THRESHOLD`` rows an HNSW graph
(``usearch``, ``pip install 'arbormem[ann]'``) answers in roughly logarithmic time.

The graph is never the source of truth. It mirrors the rows of the store's in-memory vector
cache (row ``i`` of the matrix is key ``i`` of the graph), so it is rebuilt whenever the cache
is, and it can always be rebuilt from the stored vectors; a crash can only lose the graph,
never a vector. ``save``/``load`` keep it next to the database with a *watermark* (whatever
identifies the cache state it mirrors, e.g. max rowid, deletion generation, row count and a
digest of the ids); a graph whose watermark does not match is thrown away and rebuilt.

The mirror's graph holds 8-bit quantised vectors (fast to build, small); a search takes 16k
candidates from it and ranks them by exact cosine against the cache's float32 matrix, so the
approximation is only in which candidates are found. With the defaults (M=16,
ef_construction=64, ef_search >= max(64, 2 * candidates)) recall@10 against exact search is
0.97-0.99 on clustered 384-d vectors (``tests/store/test_ann.py``). At 1M rows of hard
synthetic clusters (``tests/support/ann_check.py``, 2026-11-29, shared 2-core machine) it
is 0.945 in 0.66 ms p50 against 214 ms for exact search (0.91 with oversample 8, 0.953 with
32): not yet within a point of exact. The next lever is a denser graph (``connectivity``
32, ``expansion_add`` 128) at 2-3x the build time (236 s for 1M rows here).

How SQLiteStore uses it (one mirror per cached (user, kind) partition)::

    cache = self._refresh(user_id, kind, dim)                 # exact cache, as today
    if cache.n >= ANN_THRESHOLD and ann_available():
        mirror = self._ann.setdefault((user_id, kind), AnnMirror(dim))
        mirror.sync(cache, cache.matrix, cache.n)              # adds new rows / rebuilds
        return [(cache.ids[i], s) for i, s in mirror.search(query, k)]
    ...exact path...

and in ``put_vectors``, where it patches cached rows in place, ``mirror.patch(rows, vecs)``.
"""

from __future__ import annotations

import json
import os
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import StoreError

#: Partitions with at least this many vectors are searched through the HNSW graph. Below it
#: exact search is faster than keeping a graph (measured: 50k x 384 exact ~ 15 ms on one core).
ANN_THRESHOLD = 50_000


def ann_available() -> bool:
    """Whether the optional ``usearch`` package is installed."""
    try:
        import usearch.index  # noqa: F401
    except ImportError:
        return False
    return True


def _index_class() -> Any:
    try:
        from usearch.index import Index
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise StoreError(
            f"approximate search needs usearch: pip install 'arbormem[ann]' ({exc})"
        ) from exc
    return Index


class AnnIndex:
    """An HNSW graph over unit float32 vectors with integer keys (inner product = cosine)."""

    def __init__(self, dim: int, *, dtype: str = "f32", connectivity: int = 16,
                 expansion_add: int = 64, expansion_search: int = 64) -> None:
        if dim <= 0:
            raise ValueError("dim must be positive")
        self.dim = dim
        self.dtype = dtype
        self.expansion_search = expansion_search
        self._index = _index_class()(
            ndim=dim, metric="ip", dtype=dtype, connectivity=connectivity,
            expansion_add=expansion_add, expansion_search=expansion_search,
        )

    def __len__(self) -> int:
        return len(self._index)

    def add(self, keys: Sequence[int] | np.ndarray, vectors: np.ndarray) -> None:
        """Insert (or replace) the vectors of these keys."""
        k = np.asarray(keys, dtype=np.uint64)
        v = np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(k), self.dim)
        if len(k) == 0:
            return
        present = np.array([self._index.contains(int(x)) for x in k], dtype=bool)
        if present.any():
            self._index.remove(k[present])
        self._index.add(k, v)

    def remove(self, keys: Sequence[int] | np.ndarray) -> None:
        k = np.asarray(keys, dtype=np.uint64)
        if len(k):
            self._index.remove(k)

    def search(self, query: np.ndarray, k: int) -> list[tuple[int, float]]:
        """Up to ``k`` (key, cosine) pairs, best first."""
        n = len(self._index)
        if k <= 0 or n == 0:
            return []
        want = min(int(k), n)
        # ef below k cannot return k results; 2k keeps recall high for larger k
        self._index.expansion_search = max(self.expansion_search, 2 * want)
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(self.dim)
        found = self._index.search(q, want)
        pairs = [(int(key), 1.0 - float(d)) for key, d in zip(found.keys, found.distances, strict=True)]
        pairs.sort(key=lambda p: -p[1])
        return pairs

    # -- persistence -------------------------------------------------------------------------
    def save(self, path: str | Path, watermark: Mapping[str, Any]) -> None:
        """Write the graph and its watermark atomically (a crash leaves the old pair or none)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        self._index.save(str(tmp))
        meta = path.with_name(path.name + ".json")
        meta_tmp = meta.with_name(meta.name + ".tmp")
        meta_tmp.write_text(json.dumps({"dim": self.dim, "dtype": self.dtype, "n": len(self),
                                        "watermark": dict(watermark)}))
        # The graph first, then the watermark: a graph newer than its watermark fails the
        # size check in ``load`` and is rebuilt; never is a stale graph trusted.
        os.replace(tmp, path)
        os.replace(meta_tmp, meta)

    @classmethod
    def load(cls, path: str | Path, dim: int, watermark: Mapping[str, Any]) -> AnnIndex | None:
        """The saved graph if it exists, is readable, and mirrors exactly ``watermark``."""
        path = Path(path)
        meta = path.with_name(path.name + ".json")
        try:
            info = json.loads(meta.read_text())
            if info.get("dim") != dim or info.get("watermark") != dict(watermark):
                return None
            inst = cls(dim, dtype=str(info.get("dtype", "f32")))
            inst._index.load(str(path))
            if len(inst) != info.get("n") or inst._index.ndim != dim:
                return None
        except (OSError, ValueError, RuntimeError, KeyError, TypeError):
            return None
        return inst


class AnnMirror:
    """Keeps an ``AnnIndex`` in step with a growing matrix whose row ``i`` is key ``i``.

    ``owner`` is the object holding the matrix (SQLiteStore's ``_VecCache``): when a different
    owner is passed, or fewer rows than already mirrored, the cache was rebuilt and so is the
    graph. The graph stores 8-bit quantised vectors (7x faster to build than float32, a
    quarter of the memory); searches take ``oversample`` (16) times more candidates from it and
    rank them by exact cosine against the float32 matrix.
    """

    def __init__(self, dim: int, *, dtype: str = "i8", oversample: int = 16, **index_args: int) -> None:
        self.dim = dim
        self.dtype = dtype
        self.oversample = max(1, oversample)
        self._args = index_args
        self.index = AnnIndex(dim, dtype=dtype, **index_args)
        self.n = 0
        self._matrix: np.ndarray | None = None
        self._owner: weakref.ReferenceType[Any] | None = None
        self._owner_id: int | None = None
        self.rebuilds = 0

    def _same_owner(self, owner: object) -> bool:
        if self._owner_id != id(owner):
            return False
        try:
            return self._owner is not None and self._owner() is owner
        except TypeError:  # pragma: no cover - objects without weakref support
            return True

    def sync(self, owner: object, matrix: np.ndarray, n: int, batch: int = 65536) -> None:
        """Bring the graph up to rows ``[0, n)`` of ``matrix`` (kept for exact re-ranking)."""
        if not self._same_owner(owner) or n < self.n:
            self.index = AnnIndex(self.dim, dtype=self.dtype, **self._args)
            self.n = 0
            self.rebuilds += 1
            try:
                self._owner = weakref.ref(owner)
            except TypeError:  # pragma: no cover
                self._owner = None
            self._owner_id = id(owner)
        for start in range(self.n, n, batch):
            stop = min(n, start + batch)
            self.index.add(np.arange(start, stop, dtype=np.uint64), matrix[start:stop])
        self.n = max(self.n, n)
        self._matrix = matrix

    def patch(self, rows: Sequence[int], vectors: np.ndarray) -> None:
        """Rows already mirrored were overwritten in place (an upsert of a known id)."""
        keep = [(r, v) for r, v in zip(rows, vectors, strict=True) if r < self.n]
        if keep:
            self.index.add([r for r, _ in keep], np.stack([v for _, v in keep]))

    def search(self, query: np.ndarray, k: int) -> list[tuple[int, float]]:
        """Up to ``k`` (row, exact cosine) pairs, best first."""
        if k <= 0 or self.n == 0:
            return []
        cands = self.index.search(query, min(self.n, max(k * self.oversample, 40)))
        if self._matrix is None:
            return cands[:k]
        rows = np.fromiter((r for r, _ in cands), dtype=np.int64, count=len(cands))
        q = np.asarray(query, dtype=np.float32).reshape(self.dim)
        exact = self._matrix[rows] @ q
        order = np.argsort(-exact)[:k]
        return [(int(rows[i]), float(exact[i])) for i in order]
