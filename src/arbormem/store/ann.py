"""Approximate nearest-neighbour search for the embedded store, above a size threshold.

SQLiteStore's exact search multiplies the query with every vector of the partition: fine up
to tens of thousands of rows, linear beyond. From ``ANN_THRESHOLD`` rows on (a constructor
argument of ``SQLiteStore``) an HNSW graph (``usearch``, ``pip install 'arbormem[ann]'``)
answers in roughly logarithmic time; without usearch the store stays exact.

The graph is never the source of truth. An ``AnnMirror`` mirrors the rows of the store's
in-memory vector cache; its keys are the vectors' SQLite rowids, which survive the cache being
rebuilt (a writer deleted rows), so a rebuilt cache costs a check and removing the deleted keys, not
a new graph. The graph holds 8-bit quantised vectors (fast to build, a quarter of the memory);
a search takes ``oversample`` times more candidates from it and ranks them by exact cosine
against the cache's float32 matrix, so the approximation is only in which candidates are
found, and every score returned is exact. Graph work of ``ANN_BACKGROUND_ROWS`` rows or more
(the first build, loading and checking a saved graph, catching up after a cache rebuild) runs
in a background thread while the store keeps answering without the graph (exactly, or from
a vector snapshot's 8-bit copy with exact scores: ``store/coarse.py``); loading and checking a
saved graph leaves the GIL to the searches and waits while one runs (``_read_whole``,
``_progress``, ``SearchGate``: a 1M memory's first recall from a cold disk took 6.3-6.9 s
while they held the GIL and read their files, ~2 s now; BENCHMARKS.md, "A cold disk").

Crashes can lose the graph, never a vector. The store saves it next to the database
(``<db>.ann/<user digest>-<kind>.usearch`` plus a ``.json`` watermark: dimension, size, the
BLAKE2 digest of the graph file, whose partition it is) by writing temporary files and
renaming them, the graph first. Loading trusts nothing: a missing, partial or corrupt file
(digest, size or parse mismatch) is discarded and the graph rebuilt from the stored vectors;
a readable one is then checked vector by vector against what SQLite holds now (keys gone are
removed, new rows added, and each stored quantised vector must equal the quantised current
vector, else it is re-added), and when more than a fifth of it is stale it is rebuilt instead.

Quality at 1M (``tests/support/ann_check.py``: synthetic clusters harder than sentence
embeddings, 2,000 centres, 384-d, 200 sampled queries drawn from the same clusters; recall@10
of the graph path against exact top-10; 2026-11-29, this code, a shared 2-core machine at load
average 5-10)::

    .venv/bin/python tests/support/ann_check.py --size 1000000 --sweep 64:4,128:8,64:16 \
        --save /tmp/annruns/g

    M=32, ef_construction=128, i8 graph; build 846 s (wall, CPU shared with other work)
    ef_search:oversample   recall@10   graph p50 / p95      exact p50 / p95
    64:4   (ef 80)           0.9905    0.60 / 5.1 ms        154 / 184 ms
    128:8  (ef 160)          1.000     0.73 / 4.9 ms
    64:16  (ef 320, default) 1.000     1.12 / 5.6 ms
    save 3.1 s, load + vector-by-vector check 16.0 s, graph file 630 MB

(An earlier run of the same graph: identical recall, 0.93 / 6.3 ms at the default, build
1242 s under heavier load.) Through a real SQLiteStore file (``--store``) at 200k rows:
recall@10 0.9995 against an exact store on the same file, 6.6 / 12 ms against 36 / 45 ms
(each ANN query right after an exact one that streams 300 MB; re-measured alone the graph
search took 1.5-6 ms with the machine's load), background build 307 s, and a reopened store
reused the saved graph after a 9 s load and check.

"exact" is the store's exact path (one-thread matrix-vector product). The previous defaults,
M=16 and ef_construction=64, reached only 0.945 on the same check; searching that graph harder
barely helped (0.953 with oversample 32), the denser graph did. It is slower to build (846-1242 s
here, under load; 236 s was measured earlier for M=16, not like for like), which is one
reason large builds run in the background.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import StoreError

#: Partitions with at least this many vectors are searched through the HNSW graph. Below it
#: exact search is faster than keeping a graph (measured: 50k x 384 exact ~ 15 ms on one core).
ANN_THRESHOLD = 50_000

#: Graph work (building, loading and checking, catching up) of at least this many rows runs
#: in a background thread while the store answers without it: 20k x 384 rows took 8-13 s to
#: add here (M=32), a 1M graph 20 minutes to build and 14 s to load and check.
ANN_BACKGROUND_ROWS = 20_000

#: A graph with more stale (changed or deleted) vectors than this share is rebuilt, not
#: patched: usearch only tombstones removed nodes, and many tombstones slow the walk.
REBUILD_SHARE = 0.2

#: Graph candidates per search: ``oversample`` x k, capped at ``LARGE_K_OVERSAMPLE`` x k when
#: that is above ``OVERSAMPLE_ROWS`` (``AnnMirror.candidates``). Measured at 100k (synthetic
#: scale bench, k=200, 100 queries; "strong" = exact top-200 rows with cosine >= 0.25, ~100 a
#: query): 3,200 candidates (ef 6,400) 82.6 ms p50, recall@200 0.9997, strong 1.000; 800
#: (ef 1,600) 23.6 ms, 0.982, strong 0.997; 400 (ef 800) 12.0 ms, 0.941, strong 0.989 (the
#: machine loaded by a 1M bulk load; the exact product took 16.7 ms).
LARGE_K_OVERSAMPLE = 4
OVERSAMPLE_ROWS = 320

_CHUNK = 65536
#: Rows per batch when a loaded graph's stored vectors are checked (``AnnIndex.stale_keys``).
_GET_CHUNK = 8192


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


def _digest() -> Any:
    """The hash of a saved graph file, as its watermark records it (BLAKE2, 16 bytes)."""
    return hashlib.blake2b(digest_size=16)


def _file_digest(path: Path) -> str:
    h = _digest()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


#: Called by background graph work between its steps; it may wait (``SQLiteStore`` makes it
#: wait while a search is running, so a cold open's first recall has the disk to itself).
Pause = Callable[[], None]


def no_pause() -> None:
    return None


class SearchGate:
    """The searches running now, which background graph work waits for.

    On a cold disk a large partition is searched through all its rows (its snapshot's 8-bit
    copy since 2026-12-03) until its graph is loaded and checked; the graph threads reading
    their files at the same time made a 1M memory's first recall ~1.4 s slower (BENCHMARKS.md,
    "A cold disk"). ``pauser`` gives such work a ``Pause`` that waits while a search runs, at
    most ``step`` seconds at a time and ``total`` in all (a stream of searches must not starve
    the graph)."""

    def __init__(self) -> None:
        self._running = 0
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()

    @contextmanager
    def searching(self) -> Iterator[None]:
        with self._lock:
            self._running += 1
            self._idle.clear()
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1
                if not self._running:
                    self._idle.set()

    def pauser(self, step: float, total: float) -> Pause:
        deadline = time.monotonic() + total

        def pause() -> None:
            if not self._running:
                return
            left = deadline - time.monotonic()
            if left > 0:
                self._idle.wait(min(left, step))
        return pause


def _read_whole(path: Path, pause: Pause = no_pause) -> tuple[np.ndarray, str]:
    """The file's bytes and their BLAKE2 digest, read once. Reading and hashing release the
    GIL; usearch's own ``load(path)`` reads the file with the GIL held (see ``_progress``)."""
    size = path.stat().st_size
    # (Not a bytearray: it zero-fills all of it first, with the GIL held.)
    data = np.empty(size, dtype=np.uint8)
    view = data.data
    h = _digest()
    done = 0
    with path.open("rb", buffering=0) as f:
        while done < size:
            pause()
            n = f.readinto(view[done : done + (1 << 24)])
            if not n:
                break
            h.update(view[done : done + n])
            done += n
    view.release()
    if done != size:  # the file shrank while we read it: torn, as a digest mismatch would say
        raise OSError(f"{path}: read {done} of {size} bytes")
    return data, h.hexdigest()


def _progress(pause: Pause) -> Callable[[int, int], bool]:
    """usearch's progress callback while a graph loads from memory. usearch holds the GIL for
    the whole load (a 1M graph: about a second, longer from a cold disk when it reads the file
    itself), which stalled every recall of the store meanwhile (fusion, a pure-Python stage,
    took 1.6 s on a cold reopen). Running this bit of Python per node lets the interpreter hand
    the GIL to a waiting thread at its usual switch interval; every 65,536 nodes it also
    calls ``pause``."""
    def progress(done: int, total: int) -> bool:
        if not done & 0xFFFF:
            pause()
        return True

    # usearch checks the callback's annotations as types; this module's are strings (PEP 563).
    progress.__annotations__ = {"done": int, "total": int, "return": bool}
    return progress


class AnnIndex:
    """An HNSW graph over unit float32 vectors with integer keys (inner product = cosine)."""

    def __init__(self, dim: int, *, dtype: str = "f32", connectivity: int = 16,
                 expansion_add: int = 64, expansion_search: int = 64) -> None:
        if dim <= 0:
            raise ValueError("dim must be positive")
        self.dim = dim
        self.dtype = dtype
        self.connectivity = connectivity
        self.expansion_add = expansion_add
        self.expansion_search = expansion_search
        self._index = _index_class()(
            ndim=dim, metric="ip", dtype=dtype, connectivity=connectivity,
            expansion_add=expansion_add, expansion_search=expansion_search,
        )

    def __len__(self) -> int:
        return len(self._index)

    def keys(self) -> np.ndarray:
        return np.asarray(self._index.keys, dtype=np.int64)

    def add(self, keys: Sequence[int] | np.ndarray, vectors: np.ndarray) -> None:
        """Insert (or replace) the vectors of these keys."""
        k = np.asarray(keys, dtype=np.uint64)
        v = np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(k), self.dim)
        if len(k) == 0:
            return
        if len(self._index):
            present = np.asarray(self._index.contains(k), dtype=bool).reshape(len(k))
            if present.any():
                self._index.remove(k[present])
        # Small batches (the store's catch-up patches) go in on one thread: no pool start-up per
        # patch, and a graph that does not depend on thread timing (several threads inserting
        # at once occasionally left a fresh vector unreachable from its own query in tests).
        self._index.add(k, v, threads=1 if len(k) < 4096 else 0)

    def remove(self, keys: Sequence[int] | np.ndarray) -> None:
        k = np.asarray(keys, dtype=np.uint64)
        if len(k):
            self._index.remove(k)

    def search(self, query: np.ndarray, k: int) -> list[tuple[int, float]]:
        """Up to ``k`` (key, cosine) pairs, best first (cosine of the stored, quantised vector)."""
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

    def stale_keys(self, keys: np.ndarray, matrix: np.ndarray,
                   pause: Pause = no_pause) -> tuple[np.ndarray, np.ndarray]:
        """Graph keys not in ``keys`` (gone), and rows of ``matrix`` (row ``i`` has key
        ``keys[i]``) whose key is in the graph with another vector (stale).

        usearch stores an i8 vector as ``trunc(127 * v / |v|)``, so a stored vector is current
        when every component is within one step of that; f16/f32 within their rounding."""
        have = self.keys()
        if len(have) == 0:
            return have, np.zeros(0, dtype=np.int64)
        order = np.argsort(have)
        pos = np.searchsorted(have, keys, sorter=order)
        pos = order[np.minimum(pos, len(have) - 1)]
        rows = np.flatnonzero(have[pos] == keys)
        gone = have[~np.isin(have, keys)]
        stale = np.zeros(len(rows), dtype=bool)
        # The stored vectors a few thousand at a time: usearch's ``vectors`` builds one array
        # per key under the GIL (a 1M graph held it for seconds, stalling the store's recalls
        # while a saved graph was checked); between chunks the other threads run.
        for s in range(0, len(rows), _GET_CHUNK):
            pause()
            part = rows[s : s + _GET_CHUNK]
            ref = np.asarray(matrix[part], dtype=np.float32)
            if self.dtype == "i8":
                norms = np.linalg.norm(ref, axis=1, keepdims=True)
                ref = 127.0 * ref / np.maximum(norms, 1e-12)
                tol = 1.01
            else:
                tol = 2e-3
            got = np.vstack(self._index.get(keys[part])).astype(np.float32)
            stale[s : s + _GET_CHUNK] = np.abs(got - ref).max(axis=1) > tol
        return gone, rows[stale]

    # -- persistence -------------------------------------------------------------------------
    def save(self, path: str | Path, watermark: Mapping[str, Any]) -> None:
        """Write the graph and its watermark by rename, graph first: a crash leaves the old
        pair, or a new graph beside the old watermark, whose digest then does not match."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        _drop_orphans(path)
        tag = f".{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        tmp = path.with_name(path.name + tag)
        meta = path.with_name(path.name + ".json")
        meta_tmp = meta.with_name(meta.name + tag)
        try:
            self._index.save(str(tmp))
            meta_tmp.write_text(json.dumps({
                "dim": self.dim, "dtype": self.dtype, "n": len(self),
                "digest": _file_digest(tmp), "watermark": dict(watermark),
            }))
            os.replace(tmp, path)
            os.replace(meta_tmp, meta)
        finally:
            for leftover in (tmp, meta_tmp):
                leftover.unlink(missing_ok=True)

    @classmethod
    def load(cls, path: str | Path, dim: int, watermark: Mapping[str, Any],
             pause: Pause = no_pause) -> AnnIndex | None:
        """The saved graph if its files are whole and it was saved with ``watermark``;
        ``pause`` is called between the steps of reading it."""
        path = Path(path)
        meta = path.with_name(path.name + ".json")
        try:
            info = json.loads(meta.read_text())
            if info.get("dim") != dim or info.get("watermark") != dict(watermark):
                return None
            data, digest = _read_whole(path, pause)
            if digest != info.get("digest"):
                return None  # torn, truncated, overwritten or paired with another watermark
            inst = cls(dim, dtype=str(info.get("dtype", "f32")))
            inst._index.load(data, progress=_progress(pause))
            del data  # usearch copied it
            if len(inst) != info.get("n") or inst._index.ndim != dim:
                return None
            inst.connectivity = int(inst._index.connectivity)
            inst.expansion_add = int(inst._index.expansion_add)
        except (OSError, ValueError, RuntimeError, KeyError, TypeError, AttributeError):
            return None
        return inst

    @staticmethod
    def discard(path: str | Path) -> None:
        """Remove a saved graph and its watermark (the partition was deleted)."""
        path = Path(path)
        for p in (path, path.with_name(path.name + ".json")):
            p.unlink(missing_ok=True)
        _drop_orphans(path)


def exact_top(matrix: np.ndarray, rows: np.ndarray, query: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The best ``k`` of ``rows`` by their exact dot product with ``query`` on ``matrix``, as
    (row, score) pairs, best first: how a candidate set (the graph's, or the 8-bit pass's of
    ``store/coarse.py``) is ranked. ``einsum`` runs on one thread (see SQLiteStore)."""
    exact = np.einsum("ij,j->i", matrix[rows], query)
    if k < len(rows):
        top = np.argpartition(-exact, k)[:k]
        top = top[np.argsort(-exact[top], kind="stable")]
    else:
        top = np.argsort(-exact, kind="stable")
    return [(int(rows[i]), float(exact[i])) for i in top]


def _drop_orphans(path: Path) -> None:
    """Remove temporary files of saves whose process died (killed mid-save)."""
    for p in path.parent.glob(path.name + "*.tmp"):
        try:
            pid = int(p.name.split(".")[-3])
            os.kill(pid, 0)
        except ProcessLookupError:
            p.unlink(missing_ok=True)
        except (ValueError, IndexError, PermissionError, OSError):
            continue


class AnnMirror:
    """Keeps an ``AnnIndex`` equal to rows ``[0, n)`` of a vector cache.

    The cache is ``owner`` (SQLiteStore's ``_VecCache``) with, per row, an integer key (the
    SQLite rowid) and a float32 vector. While the owner is the same object its first ``n``
    rows only grow, and rows overwritten in place are reported in ``changed``; a different
    owner (the cache was rebuilt), or a graph loaded from disk, is reconciled key by key.
    Searches take ``oversample`` times more candidates from the graph than asked and rank
    them by exact cosine against the float32 matrix.

    Not thread-safe: the store serialises calls per mirror.
    """

    def __init__(self, dim: int, *, dtype: str = "i8", oversample: int = 16,
                 connectivity: int = 32, expansion_add: int = 128,
                 expansion_search: int = 64) -> None:
        self.dim = dim
        self.dtype = dtype
        self.oversample = max(1, oversample)
        self._args = {"connectivity": connectivity, "expansion_add": expansion_add,
                      "expansion_search": expansion_search}
        self.index = AnnIndex(dim, dtype=dtype, **self._args)
        #: Called between the steps of loading and checking a saved graph (the store sets it
        #: for background work only).
        self.pause: Pause = no_pause
        self.n = 0
        self._owner: object | None = None
        self._keys = np.zeros(0, dtype=np.int64)  # key of each mirrored row
        self._matrix: np.ndarray | None = None
        self._order: np.ndarray | None = None  # rows sorted by key, for key -> row
        self._sorted = np.zeros(0, dtype=np.int64)  # self._keys[self._order]
        self._maxkey = -1
        self._loaded = False  # the graph came from disk and is not reconciled yet
        self.tombstones = 0
        #: counters, for tests and diagnostics
        self.rebuilds = 0
        self.repaired = 0
        self.changes = 0  # graph edits since the last save

    # -- keeping in step ---------------------------------------------------------------------
    def pending(self, owner: object, n: int) -> int:
        """Rows ``sync(owner, ..., n)`` has to look at: the new ones, or all of them when the
        cache was rebuilt or the graph comes from disk."""
        if owner is self._owner and n >= self.n and not self._loaded:
            return n - self.n
        return n

    def sync(self, owner: object, keys: np.ndarray, matrix: np.ndarray, n: int,
             changed: Sequence[int] = ()) -> None:
        """Make the graph hold exactly rows ``[0, n)``: key ``keys[i]``, vector ``matrix[i]``.

        ``changed``: rows below the last ``n`` that ``owner`` overwrote in place since."""
        keys = np.asarray(keys[:n], dtype=np.int64)
        if owner is self._owner and n >= self.n and not self._loaded:
            rows = np.array(sorted({int(r) for r in changed if r < self.n}), dtype=np.int64)
            if len(rows):
                old = self._keys[rows]
                moved = old != keys[rows]  # re-inserted under a new rowid
                if moved.any():
                    self.index.remove(old[moved])
                    self.tombstones += int(moved.sum())
                    self._keys[rows] = keys[rows]
                    self._maxkey = max(self._maxkey, int(keys[rows].max()))
                    self._order = None
                self.index.add(keys[rows], matrix[rows])
                self.changes += len(rows)
            self._append(keys, matrix, n)
        else:
            # A rebuilt cache (rows renumbered, some deleted) or a graph from disk: compare
            # against what the graph holds, not against the previous matrix, whose rows
            # may have been overwritten in place after the graph last saw them.
            self._reconcile(keys, matrix, n)
        self._owner = owner
        self._matrix = matrix
        self._loaded = False
        if self.tombstones > REBUILD_SHARE * max(self.n, 1):
            self.rebuild(keys, matrix, n)

    def _append(self, keys: np.ndarray, matrix: np.ndarray, n: int) -> None:
        if n <= self.n:
            return
        new = keys[self.n : n]
        for s in range(self.n, n, _CHUNK):
            e = min(n, s + _CHUNK)
            self.index.add(keys[s:e], matrix[s:e])
        # The cache appends rows in rowid order, so the key -> row order usually just grows.
        if self._order is not None and int(new[0]) > self._maxkey and bool(np.all(np.diff(new) > 0)):
            self._order = np.concatenate([self._order, np.arange(self.n, n, dtype=np.int64)])
            self._sorted = np.concatenate([self._sorted, new])
        else:
            self._order = None
        self._keys = np.concatenate([self._keys[: self.n], new])
        self._maxkey = max(self._maxkey, int(new.max()))
        self.changes += n - self.n
        self.n = n

    def rebuild(self, keys: np.ndarray, matrix: np.ndarray, n: int) -> None:
        """A fresh graph of rows ``[0, n)``."""
        self.index = AnnIndex(self.dim, dtype=self.dtype, **self._args)
        self.n = 0
        self.tombstones = 0
        self._order = np.zeros(0, dtype=np.int64)
        self._sorted = np.zeros(0, dtype=np.int64)
        self._keys = np.zeros(0, dtype=np.int64)
        self._maxkey = -1
        self.rebuilds += 1
        self._append(np.asarray(keys[:n], dtype=np.int64), matrix, n)

    def _reconcile(self, keys: np.ndarray, matrix: np.ndarray, n: int) -> None:
        if len(self.index) == 0:
            self.rebuild(keys, matrix, n)
            return
        gone, stale = self.index.stale_keys(keys, matrix, self.pause)
        missing = np.flatnonzero(~np.isin(keys, self.index.keys()))
        if len(gone) + len(stale) > REBUILD_SHARE * max(n, 1):
            self.rebuild(keys, matrix, n)
            return
        if len(gone):
            self.index.remove(gone)
        add_rows = np.concatenate([stale, missing])
        for s in range(0, len(add_rows), _CHUNK):
            part = add_rows[s : s + _CHUNK]
            self.index.add(keys[part], matrix[part])
        self.tombstones += len(gone) + len(stale)
        self.repaired += len(gone) + len(stale)
        self.changes += len(gone) + len(add_rows)
        self._keys = keys.copy()
        self._maxkey = int(keys.max()) if n else -1
        self._order = None
        self.n = n

    # -- search ------------------------------------------------------------------------------
    def candidates(self, k: int) -> int:
        """Graph candidates taken for a top-``k`` search (the walk's ef is twice that).

        ``oversample`` times ``k``, but at most ``LARGE_K_OVERSAMPLE`` times ``k`` once that
        exceeds ``OVERSAMPLE_ROWS``: a recall asks for k=200, and 16 x 200 = 3,200 candidates
        (ef 6,400) walked a large share of a 100k graph, slower than the exact product. Small
        k (the measured recall@10 defaults above) is unchanged."""
        return max(min(k * self.oversample, max(LARGE_K_OVERSAMPLE * k, OVERSAMPLE_ROWS)), 40)

    def search(self, query: np.ndarray, k: int) -> list[tuple[int, float]]:
        """Up to ``k`` (row, exact cosine) pairs, best first."""
        if k <= 0 or self.n == 0 or self._matrix is None:
            return []
        q = np.asarray(query, dtype=np.float32).reshape(self.dim)
        want = self.candidates(k)
        rows = None
        if want < self.n:
            found = self.index.search(q, want)
            if self._order is None or len(self._order) != self.n:
                self._order = np.argsort(self._keys[: self.n], kind="stable")
                self._sorted = self._keys[self._order]
            fk = np.fromiter((key for key, _ in found), dtype=np.int64, count=len(found))
            pos = np.minimum(np.searchsorted(self._sorted, fk), self.n - 1)
            rows = self._order[pos[self._sorted[pos] == fk]]
        if rows is None or len(rows) < min(k, self.n):
            # Asked for about everything, or the walk came back short (HNSW need not reach
            # every node): score all rows, as the exact path would.
            rows = np.arange(self.n)
        return exact_top(self._matrix, rows, q, k)

    # -- persistence -------------------------------------------------------------------------
    def save(self, path: str | Path, watermark: Mapping[str, Any]) -> None:
        self.index.save(path, watermark)
        self.changes = 0

    def load(self, path: str | Path, watermark: Mapping[str, Any]) -> bool:
        """Adopt a saved graph; the next ``sync`` checks every vector of it against the cache."""
        index = AnnIndex.load(path, self.dim, watermark, self.pause)
        if index is None or index.dtype != self.dtype:
            return False
        index.expansion_search = int(self._args["expansion_search"])
        # usearch does not save ef_construction: rows added to a loaded graph would get its
        # default (64), a sparser neighbourhood than the rest of the graph
        index.expansion_add = int(self._args["expansion_add"])
        index._index.expansion_add = index.expansion_add
        self.index = index
        self._loaded = True
        self._owner = None
        self._matrix = None
        self.n = 0
        self.tombstones = 0
        self.changes = 0
        return True
