"""An 8-bit copy of a vector snapshot, for a cold memory's first searches.

A large partition reopened from its vector snapshot (``SQLiteStore._load_snapshot``) is
searched without its HNSW graph until the saved graph is loaded and checked in the background
(seconds to tens of seconds at 1M rows). Scoring every float32 row meanwhile reads the whole
snapshot, 1.5 GB of exchange vectors at 1M, which a cold disk serves at its own rate: 2.6 s of
a 3.5 s first recall on a disk reading 0.88 GB/s (BENCHMARKS.md, "The 1M SQLite bench again").

The snapshot therefore carries the same rows as int8 with one float32 scale per row
(``v ~= scale * q``, ``q = rint(v / scale)``, ``scale = max|v| / 127``), a quarter of the
bytes. A search ranks every row by the 8-bit dot product, keeps the best ``candidates(k)``
and scores those again on their float32 rows, so every score returned is exact and only the
choice of candidates is approximate, as with the graph. The rounding error of a dot product
is below 0.002 for unit 384-d vectors (measured on random unit vectors, 1M rows: the exact top
200 all among the 8-bit top 800).
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable

import numpy as np

from .ann import exact_top

#: Rows converted to float32 at a time: small enough to stay in cache (4,096 x 384 x 4 bytes =
#: 6 MB); 1M x 384 scored in 0.10 s this way, 0.36 s in 65,536-row chunks.
_CHUNK = 4096

#: Candidates re-scored exactly: ``OVERSAMPLE`` x k, at least ``MIN_CANDIDATES``.
OVERSAMPLE = 4
MIN_CANDIDATES = 400


def candidates(k: int) -> int:
    return max(OVERSAMPLE * k, MIN_CANDIDATES)


def quantise(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 rows, float32 scale per row) of a float32 matrix, a chunk at a time (the matrix
    may be a memory map of a snapshot that does not fit the page cache twice)."""
    n = len(matrix)
    codes = np.empty(matrix.shape, dtype=np.int8)
    scale = np.empty(n, dtype=np.float32)
    for s in range(0, n, 65536):
        part = np.asarray(matrix[s : s + 65536], dtype=np.float32)
        top = np.abs(part).max(axis=1) if part.shape[1] else np.zeros(len(part), np.float32)
        step = np.where(top > 0, top / 127.0, 1.0).astype(np.float32)
        codes[s : s + len(part)] = np.clip(np.rint(part / step[:, None]), -127, 127).astype(np.int8)
        scale[s : s + len(part)] = step
    return codes, scale


def approximate_scores(codes: np.ndarray, scale: np.ndarray, query: np.ndarray) -> np.ndarray:
    """The query's dot product with every row, from the 8-bit rows."""
    n = len(codes)
    q = np.asarray(query, dtype=np.float32)
    out = np.empty(n, dtype=np.float32)
    for s in range(0, n, _CHUNK):
        e = min(n, s + _CHUNK)
        out[s:e] = np.einsum("ij,j->i", codes[s:e].astype(np.float32), q)
    out *= scale[:n]
    return out


def prefetch(matrix: np.ndarray, rows: np.ndarray) -> None:
    """Ask the kernel for the pages of these rows of a memory-mapped matrix, all at once.

    Faulted in one by one, 800 scattered rows of the 1M lab memory's cold snapshot took
    0.9-1.8 s (a disk read each, waited for in turn); advised first, the disk serves them
    together: 15 ms (/work/lab/s13/prefetch_prof.py, page cache dropped). Advice only: any
    error leaves the faults to do the reading."""
    handle = getattr(matrix, "_mmap", None)
    offset = getattr(matrix, "offset", None)
    if handle is None or offset is None or not hasattr(mmap, "MADV_WILLNEED") or len(rows) == 0:
        return
    # np.memmap maps the file from the allocation boundary below the data's offset
    start = int(offset) % mmap.ALLOCATIONGRANULARITY
    width = int(matrix.shape[1]) * matrix.dtype.itemsize
    page = mmap.PAGESIZE
    try:
        for r in rows.tolist():
            first = start + r * width
            aligned = first - first % page
            handle.madvise(mmap.MADV_WILLNEED, aligned, first + width - aligned)
    except (OSError, ValueError):
        pass


def search(codes: np.ndarray, scale: np.ndarray, matrix: np.ndarray, n: int, query: np.ndarray,
           k: int, stale: Iterable[int] = ()) -> list[tuple[int, float]]:
    """Up to ``k`` (row, exact score) pairs, best first, over rows ``[0, n)`` of ``matrix``.

    ``codes`` and ``scale`` hold the first ``len(codes)`` rows (the snapshot); rows after them
    (added since the load) and the rows in ``stale`` (rewritten in place since) are scored
    on ``matrix`` only."""
    q = np.asarray(query, dtype=np.float32)
    m = min(len(codes), n)
    approx = approximate_scores(codes[:m], scale[:m], q)
    redo = np.fromiter((j for j in stale if j < m), dtype=np.int64)
    if len(redo):
        approx[redo] = np.einsum("ij,j->i", matrix[redo], q)
    want = candidates(k)
    rows = np.argpartition(-approx, want)[:want] if want < m else np.arange(m)
    rows = np.sort(rows)  # in file order
    prefetch(matrix, rows)
    return exact_top(matrix, np.concatenate([rows, np.arange(m, n, dtype=np.int64)]), q, k)
