"""The embedded default store: one SQLite file in WAL mode (or ``:memory:``).

Concurrency: each thread gets its own connection to a file database (WAL lets readers run
beside the one writer); ``transaction`` takes the write lock up front (BEGIN IMMEDIATE) so a
read-then-write placement can never interleave with another writer, in this process or
another. Busy locks are retried with backoff up to ``busy_timeout``; past it the caller gets a
``StoreError``, never a raw "database is locked".

Vector search is exact: a per-(user, kind) float32 matrix cached in memory, refreshed
incrementally from rows added since the last read (rowids only grow) and rebuilt when another
writer deleted vectors (``user_state.del_gen``). Partitions of ``ann_threshold`` rows or more
are searched through an HNSW graph mirroring that matrix (``store/ann.py``), saved beside the
database file and checked against the stored vectors whenever it is loaded. A large
partition's matrix is also saved at close (a vector snapshot, with an 8-bit copy of its rows)
and memory-mapped on the next open; until the graph is loaded and checked, searches rank the
8-bit rows and score their best candidates on the float32 ones (``store/coarse.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import random
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..errors import MigrationError, StoreError
from ..models import Exchange, Status, Topic
from ..text import token_record
from . import coarse
from .ann import (
    ANN_BACKGROUND_ROWS,
    ANN_THRESHOLD,
    REBUILD_SHARE,
    AnnIndex,
    AnnMirror,
    SearchGate,
    ann_available,
    no_pause,
)
from .base import (
    MARKS_KEY,
    ChangeRecord,
    ExchangeFilter,
    ExchangeHead,
    ExchangeText,
    IndexKind,
    Store,
    TopicRecord,
    TopicShape,
)
from .migrations import SQLITE_MIGRATIONS
from .state import TopicMeta, no_merge_in

log = logging.getLogger("arbormem.store")

_FTS = {"exchange": "exchange_fts", "topic": "topic_fts"}

_ROWS = {"exchange": "exchanges", "topic": "topics"}

#: Background graph work waits for a running vector search at most this long per step, and
#: this long in all per graph it loads (``ann.SearchGate``): on the 1M lab memory, page
#: cache dropped, the first recall took 1.4-2.4 s with it, 2.3-3.9 s without.
GRAPH_YIELD_STEP = 0.25
GRAPH_YIELD_TOTAL = 3.0

# Exact search's BLAS call runs on one thread (``SQLiteStore._exact_scores``). The limit is
# process-wide while it holds, so searches take it one at a time: a second search restoring
# the first one's limit would leave BLAS on one thread for good.
_BLAS_LOCK = threading.Lock()
_BLAS: list[Any] = []  # [the threadpoolctl controller, or None without it], on first use
# The transposed copy of ``_exact_scores`` is kept only for partitions this small (or below
# the store's ANN threshold, when lower). A big partition is searched without its graph only
# while the graph loads or builds (through the snapshot's 8-bit copy when it has one), or
# through a filter: copying 1M x 384 rows (1.9 GB, read through the whole memory-mapped
# snapshot) made a cold open's first recall take 10.8 s, not 2.
_COPY_ROWS = 50_000


def _read_ahead(matrix: np.ndarray) -> None:
    """Ask the kernel to read a memory-mapped snapshot in the background, now.

    Until its graph is loaded, a large partition is searched through every row of the
    snapshot (of its 8-bit copy, when it has one), which a cold disk (page cache dropped)
    faults in page by page while the graph's loader reads its own file; the 1.5 GB matrix of
    the 1M lab memory reads in 0.4 s sequentially. MADV_WILLNEED starts that read-ahead
    without waiting for it: that memory's first cold recall took 2.7-3.1 s with it, 4.0-4.1 s
    without (BENCHMARKS.md, "A cold disk"), before the 8-bit copy."""
    handle = getattr(matrix, "_mmap", None)
    advise = getattr(handle, "madvise", None)
    if advise is None or not hasattr(mmap, "MADV_WILLNEED"):
        return  # not a memory map, or a platform without madvise
    try:
        advise(mmap.MADV_WILLNEED)
    except (OSError, ValueError):  # advice only
        pass


def _blas_controller() -> Any:
    """threadpoolctl's controller of the loaded BLAS, or None without the package."""
    if not _BLAS:
        try:
            from threadpoolctl import ThreadpoolController

            _BLAS.append(ThreadpoolController())
        except Exception:  # not installed, or no BLAS it knows: einsum instead
            _BLAS.append(None)
    return _BLAS[0]


#: Query terms found in more of a user's exchanges than this are left out of lexical search
#: while a rarer term remains (see ``SQLiteStore.text_search``). Below ~50k exchanges hardly
#: any content word is that common, so small memories rank exactly as before.
COMMON_DF = 5_000

#: ... and so are terms found in more than ``COMMON_SHARE`` of the user's exchanges, once
#: that is more than ``COMMON_MIN_DF`` of them. Such a term's BM25 weight is small (FTS5's IDF
#: log((N - n + 0.5) / (n + 0.5)) is below log 2 = 0.69 for n > N/3, against 5-7 for a word in
#: a handful of exchanges), yet FTS5 scores every document holding it: on the LoCoMo-derived
#: 10k bench memory, where each speaker's name is in ~46% of the exchanges, the exchange search
#: took 7.7 ms CPU with the names and 5.5 ms without, its top 50 hits overlapping 99.4% on
#: average (BENCHMARKS.md, "Recall, evening pass"). Memories of a few thousand exchanges (LoCoMo's
#: conversations are ~600) rank exactly as before.
COMMON_SHARE = 1 / 3
COMMON_MIN_DF = 2_000


#: A user holding at least this share of the table's exchanges is searched without the user
#: token in the full-text MATCH (``SQLiteStore._partition``).
OWNER_SHARE = 0.5


#: Bytes of the database file read through a memory map (the first 256 MB; past that, reads).
MMAP_BYTES = 256 * 1024 * 1024


def uid_token(user_id: str) -> str:
    """The user's key in the full-text tables: a token the unicode61 tokenizer keeps whole, so
    "uid : token" filters inside the MATCH."""
    return "u" + hashlib.sha1(user_id.encode("utf-8")).hexdigest()[:20]


def _dt(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _epoch_us(value: str | None) -> int | None:
    """Microseconds since the epoch of a stored ISO time (SQL function ``arbormem_us``):
    stored times keep their own offset, so strings do not sort as instants, and SQLite's
    julianday() drops the microseconds a time may carry."""
    return None if value is None else (datetime.fromisoformat(value) - _EPOCH) // timedelta(microseconds=1)


def _filter_sql(where: ExchangeFilter | None, col: str = "") -> tuple[str, list[Any]]:
    """``AND ...`` conditions on the exchanges table (columns prefixed by ``col``) for a
    filter, and their parameters. Times compare as instants (``arbormem_us``); metadata keys
    through json_each, so any key works without path quoting."""
    if not where:
        return "", []
    sql: list[str] = []
    params: list[Any] = []
    if where.session_id is not None:
        sql.append(f"{col}session_id = ?")
        params.append(where.session_id)
    if where.since is not None:
        sql.append(f"arbormem_us({col}user_at) >= ?")
        params.append(_epoch_us(where.since.isoformat()))
    if where.until is not None:
        sql.append(f"arbormem_us({col}user_at) < ?")
        params.append(_epoch_us(where.until.isoformat()))
    for key, value in where.metadata.items():
        extra: list[Any]
        if isinstance(value, bool):
            cond, extra = f"j.type = '{'true' if value else 'false'}'", []
        elif value is None:
            cond, extra = "j.type = 'null'", []
        elif isinstance(value, (int, float)):
            cond, extra = "j.type IN ('integer', 'real') AND j.atom = ?", [value]
        else:
            cond, extra = "j.type = 'text' AND j.atom = ?", [value]
        sql.append(f"EXISTS (SELECT 1 FROM json_each({col}metadata) j WHERE j.key = ? AND {cond})")
        params += [key, *extra]
    return "".join(f" AND {c}" for c in sql), params


def _fts_body(terms: Sequence[str]) -> str:
    """FTS5 match on the body column for any of ``terms`` (each quoted as a phrase)."""
    quoted = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
    return f"body : ({quoted})"


def _fts_query(uid: str, terms: Sequence[str]) -> str:
    return f'uid : "{uid}" AND {_fts_body(terms)}'


def _vgen_key(user_id: str, kind: str) -> str:
    """Meta key of the count of in-place vector rewrites of a partition (``put_vectors``
    overwriting a stored row keeps its rowid, so rowids alone cannot show it)."""
    return f"vectors_rewritten:{kind}:{user_id}"


class _SnapshotIds:
    """The ids of a vector snapshot, decoded one at a time: decoding and indexing 1M ids took
    ~1 s, more than the rest of a cold open; a recall needs only its k results' ids."""

    __slots__ = ("blob", "starts", "extra")

    def __init__(self, blob: bytes) -> None:
        self.blob = blob  # the ids in UTF-8, each followed by a NUL (the last one too)
        ends = np.flatnonzero(np.frombuffer(blob, dtype=np.uint8) == 0)
        self.starts = np.concatenate([[0], ends + 1]).astype(np.int64)
        self.extra: list[str] = []  # ids appended after the load

    def __len__(self) -> int:
        return len(self.starts) - 1 + len(self.extra)

    def __getitem__(self, i: int) -> str:
        base = len(self.starts) - 1
        if i < 0:
            i += len(self)
        if 0 <= i < base:
            return self.blob[self.starts[i] : self.starts[i + 1] - 1].decode("utf-8")
        return self.extra[i - base]

    def __iter__(self) -> Iterator[str]:
        yield from self.blob.decode("utf-8").split("\0")[:-1]
        yield from self.extra

    def extend(self, ids: Iterable[str]) -> None:
        self.extra.extend(ids)


class _VecCache:
    __slots__ = ("ids", "_index", "matrix", "rids", "max_rid", "del_gen", "n", "patched", "vgen", "saved",
                 "cols", "cols_n", "cols_stale", "codes", "code_scale", "code_stale")

    def __init__(self, dim: int) -> None:
        self.ids: list[str] | _SnapshotIds = []
        self._index: dict[str, int] | None = {}
        self.matrix = np.zeros((0, dim), dtype=np.float32)
        self.rids = np.zeros(0, dtype=np.int64)  # rowid of each row: the ANN graph's keys
        self.max_rid = 0
        self.del_gen = -1
        self.n = 0
        # the partition's rewrite count this cache is known to match; -1: unknown (another
        # writer rewrote rows in place, which this cache does not see): never snapshotted
        self.vgen = -1
        self.saved: tuple[int, ...] | None = None  # state of the snapshot on disk, if any
        # rows overwritten in place since the ANN mirror last synced (only kept while the
        # partition has a mirror)
        self.patched: list[int] = []
        # The matrix transposed (dim x capacity), for exact search below the ANN threshold
        # (``_exact_scores``): its first ``cols_n`` columns mirror the rows, but for the rows
        # in ``cols_stale`` (rewritten in place since). Built on the first exact search.
        self.cols: np.ndarray | None = None
        self.cols_n = 0
        self.cols_stale: list[int] = []
        # The snapshot's rows in 8 bits (``store/coarse.py``), for searches before the graph is
        # ready: int8 rows and a scale per row, for the first ``len(codes)`` rows but for the
        # rows in ``code_stale`` (rewritten in place since the load).
        self.codes: np.ndarray | None = None
        self.code_scale: np.ndarray | None = None
        self.code_stale: set[int] = set()

    def rewrite(self, j: int, v: np.ndarray) -> None:
        """Overwrite row ``j`` in place (the transposed copy catches up at the next search)."""
        self.matrix[j] = v
        if self.cols is not None and j < self.cols_n:
            self.cols_stale.append(j)
        if self.codes is not None and j < len(self.codes):
            self.code_stale.add(j)
            if len(self.code_stale) > REBUILD_SHARE * len(self.codes):
                self.codes = self.code_scale = None  # mostly rewritten: exact search instead
                self.code_stale = set()

    @property
    def index(self) -> dict[str, int]:
        """id -> row; built on first use after a snapshot load (writes, filtered searches)."""
        if self._index is None:
            self._index = {i: j for j, i in enumerate(self.ids)}
        return self._index


class _AnnSlot:
    """The ANN mirror of one (user, kind) partition and the lock serialising its use."""

    __slots__ = ("mirror", "lock", "tried_load", "dropped", "building")

    def __init__(self, mirror: AnnMirror) -> None:
        self.mirror = mirror
        self.lock = threading.Lock()
        self.tried_load = False
        self.dropped = False
        self.building = False  # a background thread holds ``lock`` to build the graph


#: Exchange heads by their row (see ``SQLiteStore._head``), at most this many (~1 KB each).
_HEADS_KEPT = 16_384
_HEADS: dict[tuple[Any, ...], ExchangeHead] = {}


class SQLiteStore(Store):
    """Store on one SQLite file (WAL) or an in-memory database."""

    def __init__(
        self, path: str | Path = ":memory:", *, busy_timeout: float = 30.0,
        ann_threshold: int | None = ANN_THRESHOLD, create: bool = True,
    ) -> None:
        """``ann_threshold``: partitions with at least this many vectors are searched through
        an HNSW graph (needs ``arbormem[ann]``; exact search without it); None or 0: never.
        ``create=False`` opens an existing memory only: a missing file, or a SQLite file
        without arbormem's schema, is a ``StoreError`` and nothing is created (read-only
        commands must not leave a database behind a typo). A directory or a file that is not
        SQLite is a ``StoreError`` either way."""
        if ann_threshold is not None and ann_threshold < 0:
            raise ValueError("ann_threshold must be >= 0 or None")
        self.path = str(path)
        self.memory = self.path == ":memory:"
        self.busy_timeout = busy_timeout
        self.ann_threshold = ann_threshold or 0
        self._ann: dict[tuple[str, str], _AnnSlot] = {}
        self._ann_ok: bool | None = None  # usearch importable, checked on first use
        # graph work of at least this many rows goes to a background thread
        self._ann_background_rows = ANN_BACKGROUND_ROWS
        # partitions this large are searched through a snapshot's 8-bit copy while they have
        # no graph (smaller ones exactly: the transposed copy of ``_exact_scores`` is faster)
        self._coarse_rows = _COPY_ROWS
        # Vector searches running now: background graph work waits for them (bounded).
        self._searches = SearchGate()
        self._ann_dir = (
            None if self.memory
            else Path(self.path).expanduser().resolve().with_name(Path(self.path).name + ".ann")
        )
        self._local = threading.local()
        self._shared: sqlite3.Connection | None = None
        # The in-memory database has one connection, shared by all threads under this lock.
        self._mem_lock = threading.RLock()
        self._cache: dict[tuple[str, str], _VecCache] = {}
        self._cache_lock = threading.Lock()
        # exchange and topic heads and document frequencies per (kind, user, connection), with
        # the change token they were read at (_kept)
        self._heads_by_user: dict[tuple[str, str, int], tuple[tuple[int, int], dict[str, Any]]] = {}
        self._conns: list[sqlite3.Connection] = []
        self._closed = False
        if not self.memory:
            file = Path(self.path).expanduser()
            if file.is_dir():
                raise StoreError(f"{self.path} is a directory, not a SQLite memory file")
            if not create and not file.is_file():
                raise StoreError(f"no SQLite memory at {self.path}")
            try:
                file.resolve().parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create the folder of {self.path}: {exc.strerror or exc}") from exc
        try:
            if not create and not self.memory:
                self._check_schema()
            self._migrate()
        except sqlite3.DatabaseError as exc:  # not SQLite, unreadable, read-only, ...
            self.close()
            raise StoreError(f"{self.path} is not a usable arbormem memory: {exc}") from exc
        except StoreError:
            self.close()
            raise

    def _check_schema(self) -> None:
        """An existing arbormem memory, not any SQLite file (``create=False``)."""
        row = self._conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'").fetchone()
        if row is None:
            raise StoreError(f"{self.path} is a SQLite database but not an arbormem memory")

    # -- connections ---------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        conn.execute("PRAGMA foreign_keys = ON")
        # Deleted rows are overwritten with zeros, not just unlinked: deleted text must leave
        # the file (builds differ in their default).
        conn.execute("PRAGMA secure_delete = ON")
        if not self.memory:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            # Reads through a memory map instead of copies into a 2 MB page cache: a recall
            # touches a few hundred rows scattered over the file (candidates' heads, whole
            # exchanges, topics, full-text pages), which missed that cache at 10k exchanges
            # (46 MB); their reads took ~1.4x as long (BENCHMARKS.md, "Recall stages").
            # Only pages touched are mapped in, and they are the OS's page cache either way.
            conn.execute(f"PRAGMA mmap_size = {MMAP_BYTES}")
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
        conn.create_function("arbormem_us", 1, _epoch_us, deterministic=True)
        self._conns.append(conn)
        return conn

    @property
    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError("the store is closed")
        if self.memory:
            if self._shared is None:
                self._shared = self._connect()
            return self._shared
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
        return conn

    def reads_alongside(self) -> bool:
        # A file has a connection per thread (an in-memory database shares one under a lock,
        # so there is nothing to overlap); inside a transaction another connection would not
        # see its writes.
        return not self.memory and not self._closed and not self._conn.in_transaction

    @contextmanager
    def _guard(self) -> Iterator[sqlite3.Connection]:
        if self.memory:
            with self._mem_lock:
                yield self._conn
        else:
            yield self._conn

    def _exec(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Cursor:
        with self._guard() as conn:
            try:
                return conn.execute(sql, params)
            except sqlite3.OperationalError as exc:
                if "locked" in str(exc) or "busy" in str(exc):
                    raise StoreError(f"database busy past {self.busy_timeout}s: {exc}") from exc
                raise

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row | tuple[Any, ...]]:
        with self._guard() as conn:
            return conn.execute(sql, params).fetchall()

    def _rows_in(self, sql: str, params: Sequence[Any], values: Sequence[Any]) -> list[Any]:
        """Rows of ``sql`` whose ``{marks}`` placeholder takes ``values``, in chunks of 500
        (SQLite limits the number of bound parameters)."""
        out: list[Any] = []
        values = list(dict.fromkeys(values))
        for i in range(0, len(values), 500):
            chunk = values[i : i + 500]
            out.extend(self._rows(sql.format(marks=",".join("?" * len(chunk))), (*params, *chunk)))
        return out

    def _migrate(self) -> None:
        with self.transaction("\x00migrate"):
            conn = self._conn
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
            )
            done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
            known = {v for v, _, _ in SQLITE_MIGRATIONS}
            if done - known:
                raise MigrationError(
                    f"database {self.path} has schema versions {sorted(done - known)} "
                    "unknown to this arbormem; upgrade arbormem"
                )
            for version, name, sql in SQLITE_MIGRATIONS:
                if version in done:
                    continue
                for stmt in _split_sql(sql):
                    conn.execute(stmt)
                conn.execute(
                    "INSERT INTO schema_migrations VALUES (?, ?, ?)",
                    (version, name, datetime.now(timezone.utc).isoformat()),
                )

    # -- lifecycle -----------------------------------------------------------------------------
    @contextmanager
    def transaction(self, user_id: str) -> Iterator[None]:
        if self.memory:
            self._mem_lock.acquire()
        try:
            conn = self._conn
            if conn.in_transaction:  # nested: join the outer transaction
                yield
                return
            self._begin_immediate(conn)
            self._local.touched = set()
            try:
                yield
            except BaseException:
                conn.execute("ROLLBACK")
                self._forget_touched()
                raise
            else:
                try:
                    conn.execute("COMMIT")
                except sqlite3.OperationalError as exc:
                    conn.execute("ROLLBACK")
                    self._forget_touched()
                    raise StoreError(f"commit failed: {exc}") from exc
                if getattr(self._local, "purge_wal", False):
                    self._truncate_wal(conn)
            finally:
                self._local.touched = None
                self._local.purge_wal = False
        finally:
            if self.memory:
                self._mem_lock.release()

    def _touch(self, key: tuple[str, str]) -> None:
        """Note that a vector cache now holds this transaction's uncommitted rows."""
        touched = getattr(self._local, "touched", None)
        if touched is not None:
            touched.add(key)

    def _forget_touched(self) -> None:
        # After a rollback the caches this transaction patched or refreshed hold vectors that
        # no longer exist (and a max_rid past rowids SQLite hands out again): rebuild them on
        # next use. Their ANN mirrors stay: a new cache is reconciled with them key by key.
        touched = getattr(self._local, "touched", None) or ()
        with self._cache_lock:
            for key in touched:
                self._cache.pop(key, None)

    def _begin_immediate(self, conn: sqlite3.Connection) -> None:
        # sqlite's busy handler does not always apply to BEGIN IMMEDIATE under WAL contention
        # (e.g. when a checkpoint runs), so retry with jittered backoff up to busy_timeout.
        deadline = time.monotonic() + self.busy_timeout
        delay = 0.005
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise StoreError(str(exc)) from exc
                if time.monotonic() > deadline:
                    raise StoreError(
                        f"database stayed locked for {self.busy_timeout}s; try again later"
                    ) from exc
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.25)

    def close(self) -> None:
        if self._closed:
            return
        self._save_ann(force=True)
        try:
            self._save_snapshots()
        except (sqlite3.Error, StoreError) as exc:  # an accelerator: never fail a close over it
            log.warning("could not save the vector snapshots: %s", exc)
        self._closed = True
        for conn in self._conns:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._conns.clear()

    def get_meta(self, key: str) -> str | None:
        row = self._exec("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self._exec("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    # -- exchanges -----------------------------------------------------------------------------
    _EX_COLS = (
        "id, user_id, session_id, seq, status, messages, user_text, assistant_text, user_at, "
        "assistant_at, metadata, topic_id, failure, archived"
    )

    @staticmethod
    def _ex(row: Sequence[Any]) -> Exchange:
        return Exchange(
            id=row[0], user_id=row[1], session_id=row[2], seq=row[3], status=row[4],
            messages=tuple(json.loads(row[5])), user_text=row[6], assistant_text=row[7],
            user_at=_dt(row[8]) or datetime.fromtimestamp(0, timezone.utc),
            # ("{}", the column's default and most rows' value, needs no decoding.)
            assistant_at=_dt(row[9]), metadata={} if row[10] == "{}" else json.loads(row[10]), topic_id=row[11],
            failure=row[12], archived=bool(row[13]),
        )

    def next_seq(self, user_id: str) -> int:
        self._exec(
            "INSERT INTO user_state (user_id, last_seq) VALUES (?, 1) "
            "ON CONFLICT (user_id) DO UPDATE SET last_seq = last_seq + 1",
            (user_id,),
        )
        return int(self._exec("SELECT last_seq FROM user_state WHERE user_id = ?", (user_id,)).fetchone()[0])

    def insert_exchange(self, ex: Exchange) -> None:
        # Keep the counter past any sequence inserted directly (store copies, imports), so
        # next_seq never hands out a number already taken.
        self._exec(
            "INSERT INTO user_state (user_id, last_seq) VALUES (?, ?) "
            "ON CONFLICT (user_id) DO UPDATE SET last_seq = MAX(last_seq, excluded.last_seq)",
            (ex.user_id, ex.seq),
        )
        self._exec(
            f"INSERT INTO exchanges ({self._EX_COLS}, tokens) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                ex.id, ex.user_id, ex.session_id, ex.seq, ex.status,
                json.dumps(list(ex.messages), ensure_ascii=False), ex.user_text, ex.assistant_text,
                _iso(ex.user_at), _iso(ex.assistant_at),
                json.dumps(dict(ex.metadata), ensure_ascii=False), ex.topic_id, ex.failure,
                int(ex.archived), token_record(ex.user_text, ex.assistant_text),
            ),
        )

    def update_exchange(self, ex: Exchange) -> None:
        self._exec(
            "UPDATE exchanges SET status=?, messages=?, user_text=?, assistant_text=?, "
            "user_at=?, assistant_at=?, metadata=?, topic_id=?, failure=?, archived=?, "
            "session_id=?, tokens=? WHERE id=?",
            (
                ex.status, json.dumps(list(ex.messages), ensure_ascii=False), ex.user_text,
                ex.assistant_text, _iso(ex.user_at), _iso(ex.assistant_at),
                json.dumps(dict(ex.metadata), ensure_ascii=False), ex.topic_id, ex.failure,
                int(ex.archived), ex.session_id, token_record(ex.user_text, ex.assistant_text), ex.id,
            ),
        )

    def get_exchange(self, exchange_id: str) -> Exchange | None:
        row = self._exec(f"SELECT {self._EX_COLS} FROM exchanges WHERE id = ?", (exchange_id,)).fetchone()
        return self._ex(row) if row else None

    # "+user_id" keeps the planner off the (user_id, seq) index: with it SQLite walked every
    # row of the user and filtered by id (10k rows per recall at 10k exchanges, ~25 ms);
    # without it each id is one primary-key lookup. The user check still filters.
    def get_exchanges(self, user_id: str, ids: Sequence[str]) -> list[Exchange]:
        rows = self._rows_in(
            f"SELECT {self._EX_COLS} FROM exchanges WHERE +user_id = ? AND id IN ({{marks}})", (user_id,), ids)
        out = [self._ex(r) for r in rows]
        out.sort(key=lambda e: e.seq)
        return out

    def list_exchanges(
        self, user_id: str, *, status: Status | None = None, topic_id: str | None = None,
        after_seq: int | None = None, limit: int | None = None, newest_first: bool = False,
        where: ExchangeFilter | None = None,
    ) -> list[Exchange]:
        cond, cond_params = _filter_sql(where)
        conds, params = ["user_id = ?" + cond], [user_id, *cond_params]
        if status is not None:
            conds.append("status = ?")
            params.append(status)
        if topic_id is not None:
            conds.append("topic_id = ?")
            params.append(topic_id)
        if after_seq is not None:
            conds.append("seq > ?")
            params.append(after_seq)  # type: ignore[arg-type]
        sql = f"SELECT {self._EX_COLS} FROM exchanges WHERE {' AND '.join(conds)} ORDER BY seq"
        if newest_first:
            sql += " DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [self._ex(r) for r in self._rows(sql, params)]

    def unplaced(self, user_id: str, limit: int, after_seq: int = 0) -> list[Exchange]:
        # ``topic_id IS NULL`` is an equality on the exchanges_user_topic index: only the
        # user's rows without a topic are read (queued, pending and failed ones).
        sql = (f"SELECT {self._EX_COLS} FROM exchanges WHERE user_id = ? AND topic_id IS NULL "
               f"AND seq > ? AND status = 'completed' ORDER BY seq LIMIT {max(0, int(limit))}")
        return [self._ex(r) for r in self._rows(sql, (user_id, int(after_seq)))]

    # No JSON and no text: recall scores hundreds of candidates and renders a few dozen.
    _HEAD_COLS = f"id, seq, session_id, topic_id, user_at, status, archived, json_extract(metadata, '$.\"{MARKS_KEY}\"')"

    @staticmethod
    def _head(r: Sequence[Any]) -> ExchangeHead:
        # A head is a pure function of its row: recalls read the same rows again and again,
        # and building the (frozen) object cost ~5x looking the row up here.
        key = tuple(r)
        head = _HEADS.get(key)
        if head is None:
            meta = {MARKS_KEY: json.loads(r[7])} if r[7] else {}
            head = ExchangeHead(r[0], r[1], r[2], r[3], datetime.fromisoformat(r[4]), r[5], bool(r[6]), meta)
            if len(_HEADS) >= _HEADS_KEPT:
                _HEADS.clear()
            _HEADS[key] = head
        return head

    def exchange_heads(self, user_id: str, ids: Sequence[str]) -> list[ExchangeHead]:
        # Heads read before are kept (per user, per connection) until the database changes:
        # recall reads the heads of ~350 candidates per query, mostly the same rows from one
        # query to the next, and looking each one up was its largest read (BENCHMARKS.md,
        # "Recall stages"). The check is SQLite's own: this connection's change counter and
        # ``PRAGMA data_version`` (which moves when any other connection commits).
        cache: dict[str, ExchangeHead] = self._kept("exchange", user_id)
        missing = [i for i in ids if i not in cache]
        if missing:
            for r in self._rows_in(
                    f"SELECT {self._HEAD_COLS} FROM exchanges WHERE +user_id = ? AND id IN ({{marks}})",
                    (user_id,), missing):
                cache[r[0]] = self._head(r)
        return [h for i in dict.fromkeys(ids) if (h := cache.get(i)) is not None]

    def _kept(self, kind: str, user_id: str) -> dict[str, Any]:
        """The exchange or topic heads (or document frequencies) of ``user_id`` this thread's
        connection read since the database last changed (see exchange_heads). Per connection:
        the recall worker reads document frequencies too, and a shared entry would be emptied
        by each thread in turn."""
        with self._guard() as conn:
            token = (conn.total_changes, conn.execute("PRAGMA data_version").fetchone()[0])
        kept = self._heads_by_user
        key = (kind, user_id, id(conn))
        got = kept.get(key)
        if got is None or got[0] != token or len(got[1]) > _HEADS_KEPT:
            if len(kept) > 32:  # a few users (and threads) at a time
                kept.clear()
            got = kept[key] = (token, {})
        return got[1]

    def exchange_texts(self, user_id: str, ids: Sequence[str]) -> dict[str, ExchangeText]:
        return {r[0]: ExchangeText(r[1], r[2], r[3]) for r in self._rows_in(
            "SELECT id, user_text, assistant_text, tokens FROM exchanges WHERE +user_id = ? AND id IN ({marks})",
            (user_id,), ids)}

    def heads_by_seq(self, user_id: str, seqs: Sequence[int],
                     where: ExchangeFilter | None = None) -> list[ExchangeHead]:
        cond, params = _filter_sql(where)
        rows = self._rows_in(
            f"SELECT {self._HEAD_COLS} FROM exchanges WHERE user_id = ?{cond} AND seq IN ({{marks}})",
            (user_id, *params), sorted({int(x) for x in seqs}))
        return sorted((self._head(r) for r in rows), key=lambda h: h.seq)

    def exchanges_by_seq(self, user_id: str, seqs: Sequence[int],
                         where: ExchangeFilter | None = None) -> list[Exchange]:
        cond, params = _filter_sql(where)
        rows = self._rows_in(
            f"SELECT {self._EX_COLS} FROM exchanges WHERE user_id = ?{cond} AND seq IN ({{marks}})",
            (user_id, *params), sorted({int(x) for x in seqs}))
        return sorted((self._ex(r) for r in rows), key=lambda e: e.seq)

    def iter_exchanges(self, user_id: str, batch: int = 1000) -> Iterator[Exchange]:
        after = 0
        while True:
            rows = self.list_exchanges(user_id, after_seq=after, limit=batch)
            if not rows:
                return
            yield from rows
            after = rows[-1].seq

    def delete_exchange(self, exchange_id: str) -> None:
        row = self._exec("SELECT rid, user_id FROM exchanges WHERE id = ?", (exchange_id,)).fetchone()
        if row is None:
            return
        self.delete_index("exchange", exchange_id)
        self._exec("DELETE FROM exchanges WHERE rid = ?", (row[0],))

    def count_exchanges(self, user_id: str | None) -> dict[str, int]:
        if user_id is None:
            rows = self._rows("SELECT status, COUNT(*) FROM exchanges GROUP BY status")
        else:
            rows = self._rows(
                "SELECT status, COUNT(*) FROM exchanges WHERE user_id = ? GROUP BY status", (user_id,)
            )
        counts = {"pending": 0, "completed": 0, "failed": 0}
        counts.update({r[0]: int(r[1]) for r in rows})
        return counts

    # -- topics --------------------------------------------------------------------------------
    _T_COLS = (
        "id, user_id, kind, parent_id, title, keywords, summary, start_seq, end_seq, size, "
        "first_at, last_at, frozen, vec_sum, terms, created_seq, meta"
    )

    @staticmethod
    def _topic(row: Sequence[Any]) -> TopicRecord:
        return TopicRecord(
            id=row[0], user_id=row[1], kind=row[2], parent_id=row[3], title=row[4],
            keywords=json.loads(row[5]), summary=row[6], start_seq=row[7], end_seq=row[8],
            size=row[9], first_at=_dt(row[10]), last_at=_dt(row[11]), frozen=bool(row[12]),
            vec_sum=np.frombuffer(row[13], dtype=np.float32).copy() if row[13] else None,
            terms=json.loads(row[14]), created_seq=row[15], meta=TopicMeta.decode(json.loads(row[16])),
        )

    def put_topic(self, rec: TopicRecord) -> None:
        vec = rec.vec_sum.astype(np.float32).tobytes() if rec.vec_sum is not None else None
        self._exec(
            f"INSERT INTO topics ({self._T_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) "
            "ON CONFLICT (id) DO UPDATE SET kind=excluded.kind, parent_id=excluded.parent_id, "
            "title=excluded.title, keywords=excluded.keywords, summary=excluded.summary, "
            "start_seq=excluded.start_seq, end_seq=excluded.end_seq, size=excluded.size, "
            "first_at=excluded.first_at, last_at=excluded.last_at, frozen=excluded.frozen, "
            "vec_sum=excluded.vec_sum, terms=excluded.terms, meta=excluded.meta",
            (
                rec.id, rec.user_id, rec.kind, rec.parent_id, rec.title,
                json.dumps(rec.keywords, ensure_ascii=False), rec.summary, rec.start_seq,
                rec.end_seq, rec.size, _iso(rec.first_at), _iso(rec.last_at), int(rec.frozen),
                vec, json.dumps(rec.terms, ensure_ascii=False), rec.created_seq,
                json.dumps(rec.meta.encode(), ensure_ascii=False),
            ),
        )

    def get_topic(self, topic_id: str) -> TopicRecord | None:
        row = self._exec(f"SELECT {self._T_COLS} FROM topics WHERE id = ?", (topic_id,)).fetchone()
        return self._topic(row) if row else None

    def topic_shapes(self, user_id: str, *, ids: Sequence[str] | None = None,
                     parent_id: str | None = None) -> dict[str, TopicShape]:
        # The meta object is parsed only when it may hold a veto.
        cols = "id, kind, parent_id, size, vec_sum, CASE WHEN instr(meta, '\"no_merge\"') > 0 THEN meta END"
        if ids is not None:
            rows = self._rows_in(f"SELECT {cols} FROM topics WHERE +user_id = ? AND id IN ({{marks}})",
                                 (user_id,), ids)
        elif parent_id is not None:
            rows = self._rows(f"SELECT {cols} FROM topics WHERE user_id = ? AND parent_id = ? ORDER BY rid",
                              (user_id, parent_id))
        else:
            rows = []
        return {r[0]: TopicShape(r[0], r[1], r[2], r[3],
                                 np.frombuffer(r[4], dtype=np.float32).copy() if r[4] else None,
                                 r[5] is not None and no_merge_in(json.loads(r[5]))) for r in rows}

    def get_topics(self, user_id: str, ids: Sequence[str]) -> dict[str, TopicRecord]:
        # "+user_id": primary-key lookups, as in get_exchanges.
        rows = self._rows_in(f"SELECT {self._T_COLS} FROM topics WHERE +user_id = ? AND id IN ({{marks}})",
                             (user_id,), ids)
        return {(rec := self._topic(r)).id: rec for r in rows}

    def topic_heads(self, user_id: str, ids: Sequence[str]) -> dict[str, Topic]:
        # No vector sum, term counts or meta: those were most of what parsing a node cost. Kept
        # like exchange heads until the database changes: a recall looks up the title paths of
        # the topics it packs, one query per tree level (~10 per recall), mostly the same
        # nodes from one recall to the next.
        cache: dict[str, Topic] = self._kept("topic", user_id)
        missing = [i for i in ids if i not in cache]
        if missing:
            for r in self._rows_in(
                    "SELECT id, user_id, kind, parent_id, title, keywords, summary, start_seq, end_seq, size, "
                    "first_at, last_at, frozen FROM topics WHERE +user_id = ? AND id IN ({marks})", (user_id,), missing):
                cache[r[0]] = Topic(r[0], r[1], r[2], r[3], r[4], tuple(json.loads(r[5])), r[6], r[7], r[8], r[9],
                                    _dt(r[10]), _dt(r[11]), bool(r[12]))
        return {i: t for i in ids if (t := cache.get(i)) is not None}

    def topic_links(self, user_id: str, ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
        # Only the links out of ``meta``: decoding the whole rows (term counts, vector sums, the
        # rest of meta) of the three strongest topics was ~0.3 ms of every recall.
        rows = self._rows_in("SELECT id, meta -> '$.links' FROM topics WHERE +user_id = ? AND id IN ({marks})",
                             (user_id,), ids)
        got = {r[0]: json.loads(r[1]) if r[1] is not None else None for r in rows}
        # (What TopicMeta.decode keeps of them: the strings of a list.)
        return {i: tuple(x for x in v if isinstance(x, str)) if isinstance(v := got[i], list) else ()
                for i in dict.fromkeys(ids) if i in got}

    def list_topics(
        self, user_id: str, parent_id: str | None | Literal["*"] = "*"
    ) -> list[TopicRecord]:
        if parent_id == "*":
            rows = self._rows(f"SELECT {self._T_COLS} FROM topics WHERE user_id = ? ORDER BY rid", (user_id,))
        elif parent_id is None:
            rows = self._rows(
                f"SELECT {self._T_COLS} FROM topics WHERE user_id = ? AND parent_id IS NULL ORDER BY rid",
                (user_id,),
            )
        else:
            rows = self._rows(
                f"SELECT {self._T_COLS} FROM topics WHERE user_id = ? AND parent_id = ? ORDER BY rid",
                (user_id, parent_id),
            )
        return [self._topic(r) for r in rows]

    def delete_topic(self, topic_id: str) -> None:
        self.delete_index("topic", topic_id)
        self._exec("DELETE FROM topics WHERE id = ?", (topic_id,))

    # -- vectors -------------------------------------------------------------------------------
    def put_vectors(self, user_id: str, kind: IndexKind, ids: Sequence[str], vectors: np.ndarray) -> None:
        vectors = np.asarray(vectors, dtype=np.float32)
        with self._guard() as conn:
            conn.executemany(
                "INSERT INTO vectors (kind, item_id, user_id, vec) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (kind, item_id) DO UPDATE SET vec = excluded.vec",
                [(kind, i, user_id, v.tobytes()) for i, v in zip(ids, vectors, strict=True)],
            )
            # rows rewritten in place were counted (migration 4's trigger)
            got = conn.execute("SELECT value FROM meta WHERE key = ?", (_vgen_key(user_id, kind),)).fetchone()
        vgen = int(got[0]) if got else 0
        # An upsert keeps the old rowid, so the incremental cache refresh would not see it:
        # patch rows already cached in place (only our own writes reach here).
        key = (user_id, kind)
        with self._cache_lock:
            cache = self._cache.get(key)
            if cache is None:
                return
            if vectors.ndim != 2 or vectors.shape[1] != cache.matrix.shape[1]:
                # Another dimension (a re-embed into another model): the cached matrix and
                # its graph cannot hold it. Drop both; the next search rebuilds the cache from
                # SQLite, and a saved graph of the old dimension is refused when loaded.
                del self._cache[key]
                self._ann.pop(key, None)
                return
            self._touch(key)
            if vgen != cache.vgen:
                # our rewrite(s) counted; unless someone else's came between, the cache has
                # them all (patched below)
                cache.vgen = vgen if cache.vgen >= 0 and self._own_rewrites(cache, ids, vgen) else -1
            mirrored = key in self._ann
            for i, v in zip(ids, vectors, strict=True):
                j = cache.index.get(i)
                if j is not None:
                    cache.rewrite(j, v)
                    if mirrored:
                        cache.patched.append(j)
            if mirrored and len(cache.patched) > REBUILD_SHARE * max(cache.n, 1):
                # Most of a mirrored partition rewritten (a re-embed): replaying the patches
                # into the graph would run in the next search's thread; a new cache makes the
                # mirror reconcile, and a large rebuild goes to the background.
                del self._cache[key]

    @staticmethod
    def _own_rewrites(cache: _VecCache, ids: Sequence[str], vgen: int) -> bool:
        """Whether the rewrite count moving from ``cache.vgen`` to ``vgen`` is this call's own:
        one count per id of the call already in the cache (rows above its max rowid are new)."""
        return vgen - cache.vgen == len({i for i in ids if i in cache.index})

    def get_vectors(self, user_id: str, kind: IndexKind, ids: Sequence[str]) -> dict[str, np.ndarray]:
        rows = self._rows_in(
            "SELECT item_id, vec FROM vectors WHERE user_id = ? AND kind = ? AND item_id IN ({marks})",
            (user_id, kind), ids)
        return {item_id: np.frombuffer(blob, dtype=np.float32).copy() for item_id, blob in rows}

    def _refresh(self, user_id: str, kind: str, dim: int) -> _VecCache:
        row = self._exec("SELECT (SELECT del_gen FROM user_state WHERE user_id = ?), "
                         "(SELECT value FROM meta WHERE key = ?)", (user_id, _vgen_key(user_id, kind))).fetchone()
        del_gen = int(row[0] or 0)
        vgen = int(row[1] or 0)
        key = (user_id, kind)
        with self._cache_lock:
            cache = self._cache.get(key)
            if cache is None or cache.del_gen != del_gen or cache.matrix.shape[1] != dim:
                cache = self._load_snapshot(user_id, kind, dim, del_gen, vgen) or _VecCache(dim)
                cache.del_gen = del_gen
                cache.vgen = vgen
                self._cache[key] = cache
            elif cache.vgen != vgen:
                cache.vgen = -1  # rewritten by another writer since: do not snapshot this copy
            self._touch(key)
            rows = self._rows(
                "SELECT rid, item_id, vec FROM vectors WHERE user_id = ? AND kind = ? AND rid > ? ORDER BY rid",
                (user_id, kind, cache.max_rid),
            )
            if rows:
                mirrored = key in self._ann
                new_ids: list[str] = []
                new_vecs: list[np.ndarray] = []
                new_rids: list[int] = []
                index = cache.index
                for rid, item_id, blob in rows:
                    v = np.frombuffer(blob, dtype=np.float32)
                    j = index.get(item_id)
                    if j is not None:
                        cache.rewrite(j, v)
                        cache.rids[j] = rid
                        if mirrored:
                            cache.patched.append(j)
                    else:
                        index[item_id] = cache.n + len(new_ids)
                        new_ids.append(item_id)
                        new_vecs.append(v)
                        new_rids.append(rid)
                    cache.max_rid = max(cache.max_rid, rid)
                if new_ids:
                    need = cache.n + len(new_ids)
                    if need > cache.matrix.shape[0]:
                        size = max(need, cache.matrix.shape[0] * 2, 64)
                        grown = np.zeros((size, dim), dtype=np.float32)
                        grown[: cache.n] = cache.matrix[: cache.n]
                        cache.matrix = grown
                        grown_rids = np.zeros(size, dtype=np.int64)
                        grown_rids[: cache.n] = cache.rids[: cache.n]
                        cache.rids = grown_rids
                    cache.matrix[cache.n : need] = np.stack(new_vecs)
                    cache.rids[cache.n : need] = new_rids
                    cache.ids.extend(new_ids)
                    cache.n = need
            return cache

    def vector_search(self, user_id: str, kind: IndexKind, query: np.ndarray, k: int,
                      where: ExchangeFilter | None = None) -> list[tuple[str, float]]:
        with self._searches.searching():
            return self._vector_search(user_id, kind, query, k, where)

    def _vector_search(self, user_id: str, kind: IndexKind, query: np.ndarray, k: int,
                       where: ExchangeFilter | None) -> list[tuple[str, float]]:
        query = np.asarray(query, dtype=np.float32)
        cache = self._refresh(user_id, kind, int(query.shape[0]))
        n = cache.n
        if n == 0 or k <= 0:
            return []
        if where and kind == "exchange":
            return self._filtered_search(user_id, cache, query, k, where)
        if self.ann_threshold and n >= self.ann_threshold:
            found = self._ann_search(user_id, kind, cache, query, k)
            if found is not None:
                return [(cache.ids[i], s) for i, s in found]
        elif self._ann:
            # shrunk below the threshold: drop the graph (and stop recording patches for it);
            # its saved file is checked and caught up if the partition grows back
            with self._cache_lock:
                self._ann.pop((user_id, kind), None)
        if n >= self._coarse_rows and cache.codes is not None:
            # (reopened from a snapshot, graph not ready yet: a quarter of the bytes to read)
            with self._cache_lock:
                codes, scale, stale, matrix = cache.codes, cache.code_scale, list(cache.code_stale), cache.matrix
            if codes is not None and scale is not None:
                found = coarse.search(codes, scale, matrix, n, query, k, stale)
                ids = cache.ids
                return [(ids[i], s) for i, s in found]
        scores = self._exact_scores(cache, query, n)
        if k < n:
            top = np.argpartition(-scores, k)[:k]
        else:
            top = np.arange(n)
        top = top[np.argsort(-scores[top])]
        ids = cache.ids  # (the k scores as Python floats in one call, not one numpy scalar each)
        return list(zip([ids[i] for i in top.tolist()], scores[top].tolist(), strict=True))

    def _exact_scores(self, cache: _VecCache, query: np.ndarray, n: int) -> np.ndarray:
        """The query's dot product with the first ``n`` cached rows.

        Through a transposed copy of the matrix and one BLAS call on one thread: at 10k x 384
        that took 0.6 ms where ``einsum`` over the rows took 1.9 (AMD EPYC, 2 cores; BLAS on
        row-major rows, single-threaded, 2.3). Not on every BLAS thread: on a busy 2-core
        machine its spinning threads took 10 ms (the same trap as torch's threads;
        BENCHMARKS.md). Without threadpoolctl, or for a partition of ``_COPY_ROWS`` rows or
        more, ``einsum`` over the rows."""
        ctl = _blas_controller()
        if ctl is None or n >= min(self.ann_threshold or _COPY_ROWS, _COPY_ROWS):
            if cache.cols is not None:
                with self._cache_lock:
                    cache.cols, cache.cols_n = None, 0  # grown past it: free the copy
                    cache.cols_stale.clear()
            return np.einsum("ij,j->i", cache.matrix[:n], query)
        with self._cache_lock:
            # (A cache's rows only grow, and another dimension gets a new cache: the copy's
            # first cols_n columns stay valid but for cols_stale.)
            cols = cache.cols
            if cols is None or cols.shape[1] < n:
                # Room for a quarter more rows: appends copy only their own columns. (Below
                # the ANN threshold, 50k x 384 by default: at most ~96 MB beside the matrix.)
                grown = np.empty((cache.matrix.shape[1], max(64, n + n // 4)), dtype=np.float32)
                if cols is not None:
                    grown[:, :cache.cols_n] = cols[:, :cache.cols_n]
                cache.cols = cols = grown
            if cache.cols_n < n:
                cols[:, cache.cols_n:n] = cache.matrix[cache.cols_n:n].T
                cache.cols_n = n
            for j in cache.cols_stale:
                cols[:, j] = cache.matrix[j]
            cache.cols_stale.clear()
            view = cols[:, :n]
        with _BLAS_LOCK, ctl.limit(limits=1, user_api="blas"):
            return query @ view

    def _filtered_search(self, user_id: str, cache: _VecCache, query: np.ndarray, k: int,
                         where: ExchangeFilter) -> list[tuple[str, float]]:
        """Exact search over the rows of the exchanges the filter admits: SQLite selects them,
        the cached matrix scores only those rows (the HNSW graph, built over all of the
        user's rows, is not used: a narrow filter would leave its top-k empty)."""
        cond, params = _filter_sql(where)
        ids = [r[0] for r in self._rows(f"SELECT id FROM exchanges WHERE user_id = ?{cond}", (user_id, *params))]
        with self._cache_lock:
            rows = np.fromiter((j for i in ids if (j := cache.index.get(i)) is not None and j < cache.n),
                               dtype=np.int64)
            if rows.size == 0:
                return []
            scores = np.einsum("ij,j->i", cache.matrix[rows], query)
        top = np.argpartition(-scores, k)[:k] if k < rows.size else np.arange(rows.size)
        top = top[np.argsort(-scores[top])]
        return [(cache.ids[int(rows[t])], float(scores[t])) for t in top]

    # -- vector snapshots: a cold open reads the cache from a file, not 1M rows -------------------
    def _snap_path(self, user_id: str, kind: str) -> tuple[Path, dict[str, str]]:
        path, mark = self._ann_path(user_id, kind)
        return path.with_name(path.name.replace(".usearch", ".vectors")), mark

    def _load_snapshot(self, user_id: str, kind: str, dim: int, del_gen: int, vgen: int) -> _VecCache | None:
        """The partition's vector cache as saved at the last close, if it still holds: the
        same deletion and rewrite generations, the same number of rows up to its highest
        rowid, and that row's id and vector equal to SQLite's (files are named by a token the
        watermark gives, so a torn save is never paired with another's watermark). Rows added
        since are read by the caller's incremental refresh. None: read everything from SQLite.
        Under ``_cache_lock``."""
        if self._ann_dir is None:
            return None
        base, mark = self._snap_path(user_id, kind)
        meta = base.with_name(base.name + ".json")
        try:
            info = json.loads(meta.read_text())
        except (OSError, ValueError):
            return None
        try:
            n, max_rid = int(info["n"]), int(info["max_rid"])
            if (info.get("watermark") != mark or int(info["dim"]) != dim or int(info["del_gen"]) != del_gen
                    or int(info["vgen"]) != vgen):
                raise ValueError("generation")
            fmt = int(info.get("format", 1))
            if fmt >= 2:
                # saved under migration 6: any change below max_rid moved the rewrite count
                count, top = n, self._exec(
                    "SELECT max(rid) FROM vectors WHERE user_id = ? AND kind = ? AND rid <= ?",
                    (user_id, kind, max_rid)).fetchone()[0]
            else:
                count, top = self._exec(
                    "SELECT count(*), max(rid) FROM vectors WHERE user_id = ? AND kind = ? AND rid <= ?",
                    (user_id, kind, max_rid)).fetchone()
            last = self._exec("SELECT item_id, vec FROM vectors WHERE rid = ?", (max_rid,)).fetchone()
            if count != n or top != max_rid or last is None:
                raise ValueError("rows")
            token = str(info["token"])
            matrix = np.load(base.with_name(f"{base.name}.{token}.f32.npy"), mmap_mode="c")
            codes = scale = None
            if fmt >= 2:
                codes = np.load(base.with_name(f"{base.name}.{token}.i8.npy"), mmap_mode="r")
                scale = np.load(base.with_name(f"{base.name}.{token}.scale.npy"))
                if codes.shape != (n, dim) or codes.dtype != np.int8 or scale.shape != (n,) \
                        or scale.dtype != np.float32:
                    raise ValueError("8-bit copy shape")
            # Searches before the graph is ready read the 8-bit copy in full, the float32 rows
            # only for their candidates: read ahead what they read in full.
            _read_ahead(codes if codes is not None else matrix)
            rids = np.load(base.with_name(f"{base.name}.{token}.rid.npy"))
            ids = _SnapshotIds(base.with_name(f"{base.name}.{token}.ids").read_bytes())
            if matrix.shape != (n, dim) or matrix.dtype != np.float32 or rids.shape != (n,) or len(ids) != n:
                raise ValueError("shape")
            j = int(np.argmax(rids))
            if int(rids[j]) != max_rid or ids[j] != last[0] or matrix[j].tobytes() != bytes(last[1]):
                raise ValueError("last row")
            if codes is not None and scale is not None:
                want_codes, want_scale = coarse.quantise(matrix[j : j + 1])
                if codes[j].tobytes() != want_codes[0].tobytes() or scale[j] != want_scale[0]:
                    raise ValueError("last row's 8-bit copy")
        except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            log.info("vector snapshot %s not used (%s): reading the vectors from SQLite", base, exc)
            self._drop_snapshot(user_id, kind)
            return None
        cache = _VecCache(dim)
        cache.matrix, cache.rids, cache.ids, cache.n, cache.max_rid = matrix, rids, ids, n, max_rid
        cache._index = None
        cache.codes, cache.code_scale = codes, scale
        # a snapshot of format 1 (no 8-bit copy, rows counted) is written again at close
        cache.saved = (n, max_rid, del_gen, vgen) if codes is not None else None
        return cache

    def _save_snapshots(self) -> None:
        """Write the vector cache of each large partition whose saved copy is missing or
        behind (at close): float32 rows, rowids, ids, then the watermark naming them."""
        if self._ann_dir is None:
            return
        with self._cache_lock:
            caches = list(self._cache.items())
        for (user_id, kind), cache in caches:
            with self._cache_lock:
                state = (cache.n, cache.max_rid, cache.del_gen, cache.vgen)
                if (cache.n < self._ann_background_rows or cache.vgen < 0 or cache.saved == state
                        or self._cache.get((user_id, kind)) is not cache):
                    continue
                matrix, rids, ids = cache.matrix[: cache.n], cache.rids[: cache.n].copy(), list(cache.ids)[: cache.n]
            if any("\0" in i for i in ids):
                continue
            base, mark = self._snap_path(user_id, kind)
            token = uuid.uuid4().hex[:12]
            meta = base.with_name(base.name + ".json")
            tmp = meta.with_name(meta.name + f".{token}.tmp")
            try:
                base.parent.mkdir(parents=True, exist_ok=True)
                np.save(base.with_name(f"{base.name}.{token}.f32.npy"), matrix, allow_pickle=False)
                np.save(base.with_name(f"{base.name}.{token}.rid.npy"), rids, allow_pickle=False)
                codes, scale = coarse.quantise(matrix)
                np.save(base.with_name(f"{base.name}.{token}.i8.npy"), codes, allow_pickle=False)
                np.save(base.with_name(f"{base.name}.{token}.scale.npy"), scale, allow_pickle=False)
                del codes, scale
                base.with_name(f"{base.name}.{token}.ids").write_bytes("".join(i + "\0" for i in ids).encode("utf-8"))
                tmp.write_text(json.dumps({"token": token, "dim": int(matrix.shape[1]), "n": state[0],
                                           "max_rid": state[1], "del_gen": state[2], "vgen": state[3],
                                           "format": 2, "watermark": mark}))
                os.replace(tmp, meta)
            except OSError as exc:
                log.warning("could not save the vector snapshot %s: %s", base, exc)
                tmp.unlink(missing_ok=True)
                self._drop_snapshot(user_id, kind, keep=None)
                continue
            cache.saved = state
            self._drop_snapshot(user_id, kind, keep=token)

    def _drop_snapshot(self, user_id: str, kind: str, keep: str | None = None) -> None:
        """Remove the partition's snapshot files (all but token ``keep``'s; keep=None: the
        watermark too)."""
        if self._ann_dir is None:
            return
        base, _ = self._snap_path(user_id, kind)
        if keep is None:
            base.with_name(base.name + ".json").unlink(missing_ok=True)
        for p in base.parent.glob(base.name + ".*"):
            if p.name == base.name + ".json" or (keep is not None and p.name.startswith(f"{base.name}.{keep}.")):
                continue
            p.unlink(missing_ok=True)

    # -- approximate vector search (store/ann.py) --------------------------------------------
    def _ann_path(self, user_id: str, kind: str) -> tuple[Path, dict[str, str]]:
        assert self._ann_dir is not None
        digest = hashlib.sha256(user_id.encode("utf-8")).hexdigest()
        # the watermark names the partition: a file copied or renamed onto another is not used
        return self._ann_dir / f"{digest[:32]}-{kind}.usearch", {"user": digest, "kind": kind}

    def _ann_search(
        self, user_id: str, kind: str, cache: _VecCache, query: np.ndarray, k: int
    ) -> list[tuple[int, float]] | None:
        """(row, exact cosine) of the best ``k`` via the partition's graph; None: search exactly
        (usearch missing, or the graph is being built in the background)."""
        if self._ann_ok is None:
            self._ann_ok = ann_available()
            if not self._ann_ok:
                log.warning("usearch is not installed: exact vector search above ann_threshold "
                            "(pip install 'arbormem[ann]')")
        if not self._ann_ok:
            return None
        dim = int(query.shape[0])
        key = (user_id, kind)
        with self._cache_lock:
            if self._cache.get(key) is not cache:
                return None  # another thread just replaced this cache; it syncs the graph
            slot = self._ann.get(key)
            if slot is None or slot.mirror.dim != dim:
                slot = _AnnSlot(AnnMirror(dim))
                self._ann[key] = slot
        if slot.building:
            return None
        with slot.lock:
            if slot.building:  # started while we waited for the lock
                return None
            with self._cache_lock:
                # a consistent view of the cache: rows [0, n) and the rows patched since
                snap = (cache, cache.rids, cache.matrix, cache.n, cache.patched)
                cache.patched = []
            work = slot.mirror.pending(cache, snap[3])
            if work >= self._ann_background_rows or (
                    not slot.tried_load and snap[3] >= self._ann_background_rows):
                # Building (or loading and checking) a large graph takes seconds to minutes:
                # do it aside and answer exactly meanwhile, rather than stall this recall.
                slot.building = True
                threading.Thread(target=self._ann_build, args=(user_id, kind, slot, snap),
                                 name=f"arbormem-ann-{kind}", daemon=True).start()
                return None
            try:
                self._ann_sync(user_id, kind, slot, snap)
                return slot.mirror.search(query, k)
            except (RuntimeError, ValueError, MemoryError) as exc:
                self._ann_drop(key, slot, exc)
                return None

    def _ann_sync(self, user_id: str, kind: str, slot: _AnnSlot, snap: tuple[Any, ...]) -> None:
        """Load the saved graph on first use, bring it up to ``snap``; save when due. Under
        ``slot.lock``."""
        mirror = slot.mirror
        if not slot.tried_load and self._ann_dir is not None:
            slot.tried_load = True
            path, mark = self._ann_path(user_id, kind)
            if not mirror.load(path, mark) and path.exists():
                log.warning("ANN graph %s is unusable (torn, corrupt or foreign): "
                            "rebuilding it from the stored vectors", path)
        slot.tried_load = True
        owner, keys, matrix, n, changed = snap
        mirror.sync(owner, keys, matrix, n, changed)
        # Save after a build and then every 10% of growth (and at close): a crash costs the
        # rows added since, which the next load adds back.
        if mirror.changes and mirror.changes * 10 >= mirror.n:
            self._save_slot(user_id, kind, slot)

    def _ann_build(self, user_id: str, kind: str, slot: _AnnSlot, snap: tuple[Any, ...]) -> None:
        try:
            with slot.lock:
                # (only here: a search must not wait for itself)
                slot.mirror.pause = self._searches.pauser(GRAPH_YIELD_STEP, GRAPH_YIELD_TOTAL)
                try:
                    self._ann_sync(user_id, kind, slot, snap)
                finally:
                    slot.mirror.pause = no_pause
        except (RuntimeError, ValueError, MemoryError, OSError) as exc:
            self._ann_drop((user_id, kind), slot, exc)
        finally:
            slot.building = False

    def _ann_drop(self, key: tuple[str, str], slot: _AnnSlot, exc: BaseException) -> None:
        # the graph is only an accelerator: forget it and answer exactly (rebuilt on next use)
        log.warning("ANN graph of %s failed, searching exactly: %s", key[1], exc)
        with self._cache_lock:
            if self._ann.get(key) is slot:
                del self._ann[key]

    def _save_slot(self, user_id: str, kind: str, slot: _AnnSlot) -> None:
        if self._ann_dir is None or slot.dropped:
            return
        path, mark = self._ann_path(user_id, kind)
        try:
            slot.mirror.save(path, mark)
        except (OSError, RuntimeError) as exc:
            log.warning("could not save the ANN graph %s (it is rebuilt when needed): %s", path, exc)
        if slot.dropped:  # the user was deleted while we wrote: leave none of their vectors
            AnnIndex.discard(path)

    def _save_ann(self, force: bool = False) -> None:
        with self._cache_lock:
            slots = list(self._ann.items())
        for (user_id, kind), slot in slots:
            if slot.building:  # the builder saves when done; do not wait for it
                continue
            with slot.lock:
                if slot.mirror.changes and (force or slot.mirror.changes * 10 >= slot.mirror.n):
                    self._save_slot(user_id, kind, slot)

    # -- full text -----------------------------------------------------------------------------
    def _rid(self, kind: IndexKind, item_id: str) -> int | None:
        row = self._exec(f"SELECT rid FROM {_ROWS[kind]} WHERE id = ?", (item_id,)).fetchone()
        return int(row[0]) if row else None

    def put_text(self, user_id: str, kind: IndexKind, item_id: str, text: str) -> None:
        rid = self._rid(kind, item_id)
        if rid is None:
            raise StoreError(f"no {kind} {item_id!r} to index")
        table = _FTS[kind]
        self._exec(f"DELETE FROM {table} WHERE rowid = ?", (rid,))
        self._exec(f"INSERT INTO {table} (rowid, uid, body) VALUES (?, ?, ?)", (rid, uid_token(user_id), text))

    def text_search(self, user_id: str, kind: IndexKind, terms: Sequence[str], k: int,
                    where: ExchangeFilter | None = None) -> list[tuple[str, float]]:
        terms = [t for t in terms if t.strip()]
        if not terms or k <= 0:
            return []
        mine, top = self._partition(user_id)
        if len(set(terms)) > 1:
            # FTS5 scores every document that holds any query term, so one common term makes
            # a search linear in the partition (1.2 s at 1M exchanges, where each speaker's
            # name is in ~60k of them). A term in more than COMMON_DF of the user's exchanges
            # carries little BM25 weight there: leave it out while a rarer term remains (the
            # PostgreSQL store bounds such terms the same way, by a MaxScore cut).
            df = self.get_term_df(user_id, terms)
            common = min(COMMON_DF, max(COMMON_MIN_DF, int(COMMON_SHARE * mine)))
            rare = [t for t in terms if df.get(t, 0) <= common]  # (repeats kept: query tf)
            terms = rare or [min(terms, key=lambda t: df.get(t, 0))]
        table = _FTS[kind]
        cond, params = _filter_sql(where) if kind == "exchange" else ("", [])
        if not cond and top > 0 and mine >= OWNER_SHARE * top:
            # The user holds most of the table: match the terms alone and keep the user's rows
            # (CROSS JOIN: the full-text matches drive the join). With the user's token in the
            # MATCH, FTS5 walked that token's postings - every document of the partition - on
            # each search, and bm25() counted them: 65-140 ms at 1M exchanges against 1-2 ms
            # (BENCHMARKS.md, "Scale 1M, issue 22"). Scores are the same: bm25's statistics are
            # the table's either way, and the uid column weighs 0.
            if self._sole_user(kind, user_id):
                # Every row is the user's (one user per file, the usual case): rank inside FTS5
                # and look up only the k winners' rows, as below, instead of joining every
                # match before the sort (~15% of a search at 10k exchanges, 2-3.5k matches). A
                # winner without the user's row (a full-text row left without its exchange)
                # sends the search to the join, which leaves such rows out before ranking.
                rows = self._rows(
                    f"SELECT r.id, f.s, r.user_id FROM (SELECT rowid AS rid, bm25({table}, 0.0, 1.0) AS s "
                    f"FROM {table} WHERE {table} MATCH ? ORDER BY s LIMIT ?) f LEFT JOIN {_ROWS[kind]} r "
                    "ON r.rid = f.rid ORDER BY f.s",
                    (_fts_body(terms), int(k)),
                )
                if all(r[2] == user_id for r in rows):
                    return [(r[0], -float(r[1])) for r in rows]
            rows = self._rows(
                f"SELECT r.id, bm25({table}, 0.0, 1.0) AS s FROM {table} CROSS JOIN {_ROWS[kind]} r "
                f"ON r.rid = {table}.rowid WHERE {table} MATCH ? AND r.user_id = ? ORDER BY s LIMIT ?",
                (_fts_body(terms), user_id, int(k)),
            )
            return [(r[0], -float(r[1])) for r in rows]
        inside = (f" AND rowid IN (SELECT rid FROM exchanges WHERE user_id = ?{cond})" if cond else "")
        # Rank inside FTS5 first, then join only the k winners to their ids: joining before
        # the LIMIT looked up every matching row (thousands for a common word).
        rows = self._rows(
            f"SELECT r.id, f.s FROM (SELECT rowid AS rid, bm25({table}, 0.0, 1.0) AS s FROM {table} "
            f"WHERE {table} MATCH ?{inside} ORDER BY s LIMIT ?) f JOIN {_ROWS[kind]} r ON r.rid = f.rid "
            "ORDER BY f.s",
            (_fts_query(uid_token(user_id), terms), *([user_id, *params] if cond else []), int(k)),
        )
        # FTS5's bm25() is negative (smaller = better); flip it so higher = better.
        return [(r[0], -float(r[1])) for r in rows]

    def _sole_user(self, kind: IndexKind, user_id: str) -> bool:
        """Whether every exchange (or topic) row is ``user_id``'s (two probes of the user index)."""
        return not self._exec(f"SELECT EXISTS (SELECT 1 FROM {_ROWS[kind]} WHERE user_id < ? OR user_id > ?)",
                              (user_id, user_id)).fetchone()[0]

    def _partition(self, user_id: str) -> tuple[int, int]:
        """The user's exchange count (its sequence counter) and the table's highest rowid: two
        index lookups. When the user holds at least ``OWNER_SHARE`` of the table, a full-text
        search over every user's rows, filtered after, scores at most ~1/share times the
        user's own matches; for a smaller share the user's token stays in the MATCH."""
        row = self._exec("SELECT (SELECT last_seq FROM user_state WHERE user_id = ?), "
                         "(SELECT max(rid) FROM exchanges)", (user_id,)).fetchone()
        return int(row[0] or 0), int(row[1] or 0)

    def delete_index(self, kind: IndexKind, item_id: str) -> None:
        rid = self._rid(kind, item_id)
        if rid is not None:
            self._exec(f"DELETE FROM {_FTS[kind]} WHERE rowid = ?", (rid,))
        row = self._exec("SELECT user_id FROM vectors WHERE kind = ? AND item_id = ?", (kind, item_id)).fetchone()
        if row is not None:
            self._exec("DELETE FROM vectors WHERE kind = ? AND item_id = ?", (kind, item_id))
            self._drop_snapshot(row[0], kind)  # it holds the deleted vector
            self._exec(
                "INSERT INTO user_state (user_id, del_gen) VALUES (?, 1) "
                "ON CONFLICT (user_id) DO UPDATE SET del_gen = del_gen + 1", (row[0],),
            )

    # -- term statistics ---------------------------------------------------------------------------
    def add_term_df(self, user_id: str, terms: Sequence[str], delta: int = 1) -> None:
        with self._guard() as conn:
            conn.executemany(
                "INSERT INTO term_df (user_id, term, df) VALUES (?, ?, ?) "
                "ON CONFLICT (user_id, term) DO UPDATE SET df = MAX(0, df + excluded.df)",
                [(user_id, t, delta) for t in set(terms)],
            )

    def get_term_df(self, user_id: str, terms: Sequence[str]) -> dict[str, int]:
        sql = "SELECT term, df FROM term_df WHERE user_id = ? AND term IN ({marks})"
        if self._conn.in_transaction:  # (uncommitted counts: a rollback would leave them kept)
            return {term: int(df) for term, df in self._rows_in(sql, (user_id,), terms)}
        # Kept like heads until the database changes: a recall looks up ~150 terms for its
        # feedback step and its query's terms twice, mostly terms the recalls before it looked
        # up (word frequencies are Zipfian). None: not in the table.
        cache: dict[str, int | None] = self._kept("term_df", user_id)
        missing = [t for t in dict.fromkeys(terms) if t not in cache]
        if missing:
            got = {term: int(df) for term, df in self._rows_in(sql, (user_id,), missing)}
            for t in missing:
                cache[t] = got.get(t)
        return {t: df for t in dict.fromkeys(terms) if (df := cache.get(t)) is not None}

    # -- users and audit -------------------------------------------------------------------------
    def list_users(self) -> list[str]:
        return [r[0] for r in self._rows("SELECT DISTINCT user_id FROM exchanges ORDER BY user_id")]

    def delete_user(self, user_id: str) -> int:
        with self.transaction(user_id):
            n = int(self._exec("SELECT COUNT(*) FROM exchanges WHERE user_id = ?", (user_id,)).fetchone()[0])
            uid = uid_token(user_id)
            for table in _FTS.values():
                self._exec(f"DELETE FROM {table} WHERE uid = ?", (uid,))
            for table in ("exchanges", "topics", "vectors", "changes", "term_df", "user_state"):
                self._exec(f"DELETE FROM {table} WHERE user_id = ?", (user_id,))
            self._exec("DELETE FROM meta WHERE key IN (?, ?)", [_vgen_key(user_id, k) for k in _ROWS])
            self.purge_deleted_text()
        with self._cache_lock:
            for key in [k for k in self._cache if k[0] == user_id]:
                del self._cache[key]
            dropped = [self._ann.pop(key) for key in [k for k in self._ann if k[0] == user_id]]
        for slot in dropped:
            # not under slot.lock: a background build may hold it for minutes; a save racing
            # with this sees the flag after writing and removes its file (``_save_slot``)
            slot.dropped = True
        if self._ann_dir is not None:
            for kind in _ROWS:  # the graph files hold (quantised) vectors of the user
                AnnIndex.discard(self._ann_path(user_id, kind)[0])
                self._drop_snapshot(user_id, kind)
        return n

    def _truncate_wal(self, conn: sqlite3.Connection) -> None:
        """Copy the WAL into the database and empty it. The WAL keeps every page version a
        transaction wrote until a checkpoint resets it, so the text of deleted rows stayed in
        it, readable, for as long as the memory was open (issue 19). TRUNCATE waits (up to
        ``busy_timeout``) for readers of older snapshots; if one still holds on, the frames stay
        until the next checkpoint, and the database file itself is clean either way."""
        if self.memory:
            return
        try:
            busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        except sqlite3.OperationalError as exc:
            log.warning("WAL checkpoint after a deletion failed: %s", exc)
            return
        if busy:
            log.warning("WAL checkpoint after a deletion was blocked by a reader; deleted text "
                        "stays in %s-wal until the next checkpoint", self.path)

    # -- Exportable (store/migrate.py): what the contract does not expose, for lossless copies --
    def iter_text(self, user_id: str, kind: IndexKind) -> Iterable[tuple[str, str]]:
        """(id, full-text body) of the user's rows of ``kind``, by id."""
        rows = self._rows(
            f"SELECT r.id, f.body FROM {_FTS[kind]} f JOIN {_ROWS[kind]} r ON r.rid = f.rowid "
            f"WHERE f.uid = ? AND r.user_id = ? ORDER BY r.id",
            (uid_token(user_id), user_id),
        )
        return [(r[0], r[1]) for r in rows]

    def iter_vector_ids(self, user_id: str, kind: IndexKind) -> list[str]:
        rows = self._rows(
            "SELECT item_id FROM vectors WHERE user_id = ? AND kind = ? ORDER BY item_id", (user_id, kind)
        )
        return [r[0] for r in rows]

    def iter_term_df(self, user_id: str) -> list[tuple[str, int]]:
        rows = self._rows("SELECT term, df FROM term_df WHERE user_id = ? ORDER BY term", (user_id,))
        return [(r[0], int(r[1])) for r in rows]

    def iter_meta(self) -> list[tuple[str, str]]:
        # the rewrite counters belong to this file's vector snapshots, not to the memory
        return [(r[0], r[1]) for r in self._rows(
            "SELECT key, value FROM meta WHERE key NOT LIKE 'vectors\\_rewritten:%' ESCAPE '\\' ORDER BY key")]

    def get_last_seq(self, user_id: str) -> int:
        row = self._exec("SELECT last_seq FROM user_state WHERE user_id = ?", (user_id,)).fetchone()
        return int(row[0]) if row else 0

    def ensure_seq(self, user_id: str, seq: int) -> None:
        self._exec(
            "INSERT INTO user_state (user_id, last_seq) VALUES (?, ?) ON CONFLICT (user_id) "
            "DO UPDATE SET last_seq = MAX(last_seq, excluded.last_seq)",
            (user_id, int(seq)),
        )

    def put_change(self, rec: ChangeRecord) -> None:
        self._exec(
            "INSERT OR IGNORE INTO changes (id, user_id, at, action, target_id, detail) "
            "VALUES (?,?,?,?,?,?)",
            (rec.id, rec.user_id, rec.at.isoformat(), rec.action, rec.target_id,
             json.dumps(rec.detail, ensure_ascii=False, default=str)),
        )

    def raw_connection(self) -> sqlite3.Connection:
        """This thread's connection, for ``arbormem check``, which must read what is on disk
        (not what the caches believe). Read with it; write through the Store methods."""
        return self._conn

    def clear_derived(self, user_id: str, last_seq: int) -> None:
        """Drop everything derived from the user's transcript (topics, vectors, full text, term
        statistics, every exchange's topic), keeping the exchange rows; the sequence counter
        is raised to ``last_seq`` if below. For a repair that places the transcript again in
        the same transaction (``check.py``)."""
        uid = uid_token(user_id)
        for table in ("exchange_fts", "topic_fts"):
            self._exec(f"DELETE FROM {table} WHERE uid = ?", (uid,))
        for table in ("topics", "vectors", "term_df"):
            self._exec(f"DELETE FROM {table} WHERE user_id = ?", (user_id,))
        for kind in _ROWS:
            self._drop_snapshot(user_id, kind)
        self._exec(
            "INSERT INTO user_state (user_id, last_seq, del_gen) VALUES (?, ?, 1) "
            "ON CONFLICT (user_id) DO UPDATE SET last_seq = MAX(last_seq, excluded.last_seq), "
            "del_gen = del_gen + 1",
            (user_id, last_seq),
        )
        self._exec("UPDATE exchanges SET topic_id = NULL WHERE user_id = ?", (user_id,))

    def purge_deleted_text(self) -> None:
        # FTS5 marks a deleted row in a new segment and keeps its tokens in the old ones until
        # segments merge, so deleted text stays readable in the file (found by scanning it:
        # tests/robust/test_isolation.py). 'optimize' merges every segment into one, dropping
        # them; it costs a rewrite of the index, paid by deletions only. (SQLite >= 3.44 has
        # the cheaper 'secure-delete' option.)
        for table in _FTS.values():
            self._exec(f"INSERT INTO {table} ({table}) VALUES ('optimize')")
        # A term no exchange uses any more (df 0) is a word of the deleted text: drop it.
        self._exec("DELETE FROM term_df WHERE df <= 0")
        # Deleted rows are zeroed in their pages (secure_delete); the WAL still holds the old
        # page versions until it is checkpointed and emptied, after this transaction commits.
        self._local.purge_wal = True

    def log_change(self, user_id: str, action: str, target_id: str, detail: dict[str, Any]) -> str:
        change_id = "c_" + uuid.uuid4().hex
        self._exec(
            "INSERT INTO changes (id, user_id, at, action, target_id, detail) VALUES (?,?,?,?,?,?)",
            (
                change_id, user_id, datetime.now(timezone.utc).isoformat(), action, target_id,
                json.dumps(detail, ensure_ascii=False, default=str),
            ),
        )
        return change_id

    def list_changes(self, user_id: str, target_id: str | None = None, limit: int = 100) -> list[ChangeRecord]:
        if target_id is None:
            rows = self._rows(
                "SELECT id, user_id, at, action, target_id, detail FROM changes WHERE user_id = ? "
                "ORDER BY rid DESC LIMIT ?", (user_id, limit),
            )
        else:
            rows = self._rows(
                "SELECT id, user_id, at, action, target_id, detail FROM changes WHERE user_id = ? "
                "AND target_id = ? ORDER BY rid DESC LIMIT ?", (user_id, target_id, limit),
            )
        return [
            ChangeRecord(id=r[0], user_id=r[1], at=datetime.fromisoformat(r[2]), action=r[3],
                         target_id=r[4], detail=json.loads(r[5]))
            for r in rows
        ]


def _split_sql(script: str) -> list[str]:
    """Split a migration script into statements (no statement here contains ';' or '--' in a
    string; a trigger's body, whose statements end in ';', stays whole)."""
    body = "\n".join(line.split("--", 1)[0] for line in script.splitlines())
    out: list[str] = []
    part = ""
    for piece in body.split(";"):
        part += piece + ";"
        if sqlite3.complete_statement(part):
            if part.strip(" \n;"):
                out.append(part.strip().rstrip(";").strip())
            part = ""
    if part.strip(" \n;"):
        out.append(part.strip().rstrip(";").strip())
    return out
