"""The scale-out store: PostgreSQL with pgvector, for many processes and machines at once.

    store = PostgresStore("postgresql://user:pw@host/db")        # or Memory(database_url=...)

Needs ``pip install 'arbormem[postgres]'`` (psycopg 3 with its pool, and pgvector) and a server
with the ``vector`` extension available (the first open runs ``CREATE EXTENSION vector``).

Design, and why:

* **Connections** come from a ``psycopg_pool.ConnectionPool`` (``min_size``/``max_size``).
  Outside ``transaction`` every call takes a pooled connection and commits on its own.
* **Writers of one user serialise across processes**: ``transaction(user_id)`` opens a
  transaction and takes ``pg_advisory_xact_lock(<arbormem namespace>, hashtext(user_id))``;
  the lock goes away with the commit/rollback, even if the process dies. Writers of
  different users proceed in parallel. The transaction's connection is kept in a context
  variable, so every store call in the block (and a nested ``transaction``) runs on it.
* **Sequence numbers** come from a per-user counter row (``arbormem_users.last_seq``) bumped
  by one ``INSERT ... ON CONFLICT DO UPDATE ... RETURNING``: the row lock alone makes
  allocation safe, the advisory lock makes "allocate, then insert" atomic with the rest of the
  write. Inserting an exchange raises the counter to at least its ``seq``, so imported or
  migrated memories continue where they left off.
* **Per-user partitioning**: every query on user data filters on ``user_id``; the lookups
  by id alone (``get_exchange``, ``get_topic``, ``delete_*``) use globally unique ids.
* **Vectors** live in one dimension-less ``vector`` column; the dimension is only known at
  the first ``put_vectors``. Then a partial HNSW expression index is created for it,
  ``((embedding::vector(D)) vector_cosine_ops) WHERE dim = D``, and ``D`` is recorded in the
  meta key ``pg_vector_dims``. A second embedder with another dimension gets its own index,
  so re-embedding into a new model needs no table rewrite. Search runs with
  ``hnsw.iterative_scan = relaxed_order`` so the per-user filter cannot starve the result;
  for small partitions PostgreSQL's planner prefers the ``(user_id, kind, dim)`` btree and an
  exact sort, for big ones the approximate HNSW scan (results are re-sorted exactly).
* **Lexical search**: a ``tsvector`` + GIN index, with tokens made by arbormem (Unicode words,
  lower-cased, diacritics stripped, English words Porter-stemmed — FTS5's ``porter unicode61``
  rules) rather than a server text
  search configuration, so results do not depend on the server locale or language. Ranking
  is BM25 (k1=1.2, b=0.75, Lucene's idf) from stored term positions and per-(user, kind)
  document stats. Every posting of a term found in at most ``_POSTINGS_CAP`` documents is
  read; a more common term (low idf) only rescores the documents that can still reach the
  top k (a MaxScore bound), so the cost of a search stops growing with the partition: exact
  whenever the rarer terms find k documents, and 0.96 overlap@10 with exact BM25 on the
  100k-exchange synthetic bench otherwise. Equal scores rank oldest first, as in FTS5.
  Whether a term is common is itself not counted every time: the document frequency of each
  common term is recorded per (user, kind) in ``arbormem_text_df`` (by the first search that
  meets it, from any process, or by ``finish_load`` after a bulk load) and trusted until the
  partition grows by 10% or shrinks; counting even up to the cap builds a GIN bitmap of all
  the term's postings, which grows with the partition. Each kind has its own partial GIN
  index (migration 5), and a user holding most of a kind's rows is filtered after the GIN
  scan rather than through the (user_id, kind) btree, which would read a whole partition.
  The GIN index has no pending list (``fastupdate = off``, migration 3): the write path
  rewrites several index entries per exchange, and an unmerged list of up to 4 MB was read
  by every search. Searches run without parallel workers (their statements are small).
  Search plans need statistics that know how big the user's partition is, and autovacuum
  may not analyze a table filled in a minute before it is searched: ``put_text`` runs
  ``ANALYZE arbormem_text`` when a user's index of one kind reaches 4,096 documents and at
  every doubling (inside the writer's transaction: it waits for another ANALYZE or VACUUM
  of the table, and a role that does not own the table only gets a warning).
* **Timestamps** are ``timestamptz``: aware datetimes round-trip as the same instant (returned
  in UTC); naive datetimes are taken to be UTC.

Async: ``AsyncMemory`` runs each whole store-using call in a worker thread
(``asyncio.to_thread``). That is safe: every thread gets its own pooled connection, and a
write opens and closes its ``transaction`` inside that one thread (``to_thread`` copies the
caller's context, so never open a transaction in one offloaded call and use it from another).
The pool (``max_size``) bounds the database work in flight. Create the store after forking:
the pool runs background threads.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ..errors import MigrationError, StoreError, ValidationError
from ..models import Exchange, Status
from ..text import index_tokens as tokens
from ..text import token_record
from .base import (
    ChangeRecord,
    ExchangeFilter,
    ExchangeText,
    IndexKind,
    Store,
    TopicRecord,
    TopicShape,
)
from .pg_migrations import PG_MIGRATIONS
from .state import TopicMeta, no_merge_in

if TYPE_CHECKING:
    import psycopg

# First key of every advisory lock arbormem takes (two-int form), so its locks cannot collide
# with other applications' advisory locks in a shared database. "ARBM" as an int32.
_LOCK_NS = 0x4152424D
_MIGRATION_LOCK = 0  # second key of the global migration / DDL lock
_DDL_LOCK = 1
_KINDS = ("exchange", "topic")
_BM25_K1 = 1.2
_BM25_B = 0.75
# Text search reads every posting of a query term found in at most this many documents; a
# term in more documents (low idf in a big partition) only scores the candidates found by
# the rarer terms (see text_search).
_POSTINGS_CAP = 1000
# Document frequencies of common terms are counted exactly up to this partition size, and
# estimated from a page sample of about _DF_SAMPLE documents beyond it.
_EXACT_DF_DOCS = 50_000
_DF_SAMPLE = 20_000
_MAX_POSITIONS = 255  # tsvector keeps at most 256 positions per lexeme
# put_text runs ANALYZE on the lexical table when a user's index of one kind reaches this many
# documents, and again at every doubling (4,096, 8,192, ...; about 10 times up to 1M).
_ANALYZE_FROM = 4096


def _needs_analyze(n_docs: int) -> bool:
    return n_docs >= _ANALYZE_FROM and n_docs & (n_docs - 1) == 0


def _import_psycopg() -> Any:
    try:
        import psycopg
        import psycopg_pool  # noqa: F401
        from pgvector.psycopg import register_vector  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise StoreError(
            "PostgreSQL support needs extra packages: pip install 'arbormem[postgres]' "
            f"({exc})"
        ) from exc
    return psycopg


def restem_text_index(conn: Any) -> None:
    """Schema version 2: rebuild every stored tsvector with stemmed tokens (token counts, and
    so the BM25 statistics, do not change). Runs inside the migration transaction."""
    # A server-side cursor streams the rows: a million bodies need not sit in memory at once.
    with conn.cursor(name="arbormem_restem") as read, conn.cursor() as write:
        read.execute("SELECT kind, item_id, body FROM arbormem_text")
        while rows := read.fetchmany(1000):
            write.executemany(
                "UPDATE arbormem_text SET tsv = %s::tsvector WHERE kind = %s AND item_id = %s",
                [(_tsvector_literal(tokens(body)), kind, item_id) for kind, item_id, body in rows],
            )


def _tsvector_literal(toks: list[str]) -> str:
    positions: dict[str, list[int]] = {}
    for pos, tok in enumerate(toks, start=1):
        plist = positions.setdefault(tok, [])
        if len(plist) < _MAX_POSITIONS:
            plist.append(min(pos, 16383))  # tsvector positions stop at 16383
    # Tokens are letter/digit runs: no quote or backslash needs escaping.
    return " ".join(f"'{lex}':{','.join(map(str, plist))}" for lex, plist in positions.items())


def _filter_sql(where: ExchangeFilter | None, col: str = "") -> tuple[str, list[Any]]:
    """``AND ...`` conditions on arbormem_exchanges (columns prefixed by ``col``) for a filter,
    and their parameters. Metadata equality is jsonb containment of ``{key: value}``: numbers
    compare by value, ``true`` is not ``1``, as in the SQLite store."""
    if not where:
        return "", []
    sql: list[str] = []
    params: list[Any] = []
    if where.session_id is not None:
        sql.append(f"{col}session_id = %s")
        params.append(where.session_id)
    if where.since is not None:
        sql.append(f"{col}user_at >= %s")
        params.append(where.since)
    if where.until is not None:
        sql.append(f"{col}user_at < %s")
        params.append(where.until)
    for key, value in where.metadata.items():
        sql.append(f"{col}metadata::jsonb @> %s::jsonb")
        params.append(json.dumps({key: value}))
    return "".join(f" AND {c}" for c in sql), params


def _admitted(where: ExchangeFilter | None, item: str, user_id: str) -> tuple[str, list[Any]]:
    """``AND item IN (exchanges the filter admits)`` for index tables keyed by item id."""
    cond, params = _filter_sql(where, "e.")
    if not cond:
        return "", []
    return f" AND {item} IN (SELECT e.id FROM arbormem_exchanges e WHERE e.user_id = %s{cond})", [user_id, *params]


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


def _check_kind(kind: str) -> str:
    # ``kind`` is inlined into some SQL (partial-index predicates need literals), so check it.
    if kind not in _KINDS:
        raise ValidationError(f"unknown index kind {kind!r}; expected 'exchange' or 'topic'")
    return kind


@dataclass
class _Tx:
    conn: Any
    users: set[str] = field(default_factory=set)
    #: vector dimensions whose HNSW index this transaction created (known once it commits)
    new_dims: set[int] = field(default_factory=set)


class PostgresStore(Store):
    """Store on a PostgreSQL database with the pgvector extension (see the module docstring)."""

    def __init__(
        self, url: str, *, min_size: int = 1, max_size: int = 8, timeout: float = 30.0,
        ef_search: int = 200,
    ) -> None:
        """Open (and migrate) the database at ``url``; ``ef_search`` is the HNSW candidate
        list per vector search (at least 2k): higher finds more true neighbours, slower."""
        if not url.startswith(("postgresql://", "postgres://")):
            raise ValidationError("PostgresStore needs a postgresql:// URL")
        if min_size < 0 or max_size < 1 or min_size > max_size:
            raise ValidationError("PostgresStore needs 0 <= min_size <= max_size and max_size >= 1")
        self._psycopg = _import_psycopg()
        self.url = url
        self.timeout = timeout
        self.ef_search = max(1, int(ef_search))
        self._tx: ContextVar[_Tx | None] = ContextVar(f"arbormem_pg_tx_{id(self)}", default=None)
        self._vector_dims: set[int] = set()
        self._closed = False
        self._migrate()
        from psycopg_pool import ConnectionPool

        self._pool = ConnectionPool(
            url, min_size=min_size, max_size=max_size, timeout=timeout,
            configure=self._configure, open=False, name="arbormem",
        )
        try:
            self._pool.open(wait=True, timeout=timeout)
        except Exception as exc:
            self._pool.close()
            raise StoreError(f"cannot connect to PostgreSQL: {exc}") from exc

    def __repr__(self) -> str:
        return f"PostgresStore({_redact(self.url)!r})"

    # -- connections ---------------------------------------------------------------------------
    @staticmethod
    def _configure(conn: psycopg.Connection[Any]) -> None:
        from pgvector.psycopg import register_vector

        register_vector(conn)
        # UTC so timestamptz values come back in one zone whatever the server's default;
        # iterative HNSW scans so a per-user filter cannot leave a search short of k rows.
        conn.execute("SET TIME ZONE 'UTC'")
        conn.commit()
        try:
            conn.execute("SET hnsw.iterative_scan = relaxed_order")
            conn.commit()
        except Exception:  # pgvector < 0.8 has no iterative scans: plain HNSW scans then
            conn.rollback()

    def _migrate(self) -> None:
        psycopg = self._psycopg
        try:
            conn = psycopg.connect(self.url, connect_timeout=max(1, int(self.timeout)))
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to PostgreSQL at {_redact(self.url)}: {exc}") from exc
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_LOCK_NS, _MIGRATION_LOCK))
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS arbormem_schema_migrations (version INTEGER "
                    "PRIMARY KEY, name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
                )
                done = {r[0] for r in conn.execute("SELECT version FROM arbormem_schema_migrations")}
                known = {v for v, _, _ in PG_MIGRATIONS}
                if done - known:
                    raise MigrationError(
                        f"database has arbormem schema versions {sorted(done - known)} unknown "
                        "to this arbormem; upgrade arbormem"
                    )
                for version, name, step in PG_MIGRATIONS:
                    if version in done:
                        continue
                    if callable(step):  # a data migration, written in Python
                        step(conn)
                    else:
                        conn.execute(step)
                    conn.execute(
                        "INSERT INTO arbormem_schema_migrations (version, name) VALUES (%s, %s)",
                        (version, name),
                    )
        except psycopg.Error as exc:
            hint = ""
            if "vector" in str(exc):
                hint = " (the pgvector extension must be installed on the server; a superuser can run CREATE EXTENSION vector)"
            raise MigrationError(f"PostgreSQL schema migration failed: {exc}{hint}") from exc
        finally:
            conn.close()

    @contextmanager
    def _conn(self) -> Iterator[Any]:
        """The current transaction's connection, or a pooled one committed at the end."""
        if self._closed:
            raise StoreError("the store is closed")
        psycopg = self._psycopg
        tx = self._tx.get()
        try:
            if tx is not None:
                yield tx.conn
            else:
                with self._pool.connection() as conn:
                    yield conn
        except psycopg.Error as exc:  # includes the pool's PoolTimeout / PoolClosed
            raise StoreError(f"PostgreSQL error: {exc}") from exc

    # -- lifecycle -----------------------------------------------------------------------------
    def reads_alongside(self) -> bool:
        # Every statement outside a transaction takes a pooled connection of its own.
        return self._tx.get() is None

    @contextmanager
    def transaction(self, user_id: str) -> Iterator[None]:
        tx = self._tx.get()
        if tx is not None:  # nested: join the outer transaction (and lock this user too)
            if user_id not in tx.users:
                self._lock_user(tx.conn, user_id)
                tx.users.add(user_id)
            yield
            return
        tx = _Tx(None, {user_id})
        with self._conn() as conn:
            self._lock_user(conn, user_id)
            tx.conn = conn
            token = self._tx.set(tx)
            try:
                yield
            finally:
                self._tx.reset(token)
        # leaving the pool's block committed (or, on an exception, rolled back)
        self._vector_dims |= tx.new_dims

    def _lock_user(self, conn: Any, user_id: str) -> None:
        try:
            conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_LOCK_NS, user_id))
        except self._psycopg.Error as exc:
            raise StoreError(f"cannot lock user {user_id!r}: {exc}") from exc

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.close()

    def get_meta(self, key: str) -> str | None:
        with self._conn() as conn:
            row = conn.execute("SELECT value FROM arbormem_meta WHERE key = %s", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        with self._conn() as conn:
            conn.execute(
                "INSERT INTO arbormem_meta (key, value) VALUES (%s, %s) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    # -- exchanges -----------------------------------------------------------------------------
    _EX_COLS = (
        "id, user_id, session_id, seq, status, messages, user_text, assistant_text, user_at, "
        "assistant_at, metadata, topic_id, failure, archived"
    )

    @staticmethod
    def _ex(row: Sequence[Any]) -> Exchange:
        return Exchange(
            id=row[0], user_id=row[1], session_id=row[2], seq=int(row[3]), status=row[4],
            messages=tuple(row[5]), user_text=row[6], assistant_text=row[7], user_at=row[8],
            assistant_at=row[9], metadata=row[10], topic_id=row[11], failure=row[12],
            archived=bool(row[13]),
        )

    @staticmethod
    def _json(value: Any) -> Any:
        from psycopg.types.json import Json

        return Json(value, dumps=_dumps)

    def next_seq(self, user_id: str) -> int:
        with self._conn() as conn:
            row = conn.execute(
                "INSERT INTO arbormem_users (user_id, last_seq) VALUES (%s, 1) "
                "ON CONFLICT (user_id) DO UPDATE SET last_seq = arbormem_users.last_seq + 1 "
                "RETURNING last_seq",
                (user_id,),
            ).fetchone()
        return int(row[0])

    def insert_exchange(self, ex: Exchange) -> None:
        # One round trip: the row, and the user's counter raised to at least its seq.
        with self._conn() as conn:
            conn.execute(
                f"WITH ins AS (INSERT INTO arbormem_exchanges ({self._EX_COLS}, tokens) "
                "VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) RETURNING user_id, seq) "
                "INSERT INTO arbormem_users (user_id, last_seq) SELECT user_id, seq FROM ins "
                "ON CONFLICT (user_id) DO UPDATE SET last_seq = "
                "GREATEST(arbormem_users.last_seq, excluded.last_seq)",
                (
                    ex.id, ex.user_id, ex.session_id, ex.seq, ex.status,
                    self._json(list(ex.messages)), ex.user_text, ex.assistant_text,
                    _utc(ex.user_at), _utc(ex.assistant_at), self._json(dict(ex.metadata)),
                    ex.topic_id, ex.failure, ex.archived, token_record(ex.user_text, ex.assistant_text),
                ),
            )

    def update_exchange(self, ex: Exchange) -> None:
        with self._conn() as conn:
            conn.execute(
                "UPDATE arbormem_exchanges SET status=%s, messages=%s, user_text=%s, "
                "assistant_text=%s, user_at=%s, assistant_at=%s, metadata=%s, topic_id=%s, "
                "failure=%s, archived=%s, session_id=%s, tokens=%s WHERE id=%s AND user_id=%s",
                (
                    ex.status, self._json(list(ex.messages)), ex.user_text, ex.assistant_text,
                    _utc(ex.user_at), _utc(ex.assistant_at), self._json(dict(ex.metadata)),
                    ex.topic_id, ex.failure, ex.archived, ex.session_id,
                    token_record(ex.user_text, ex.assistant_text), ex.id, ex.user_id,
                ),
            )

    def get_exchange(self, exchange_id: str) -> Exchange | None:
        with self._conn() as conn:
            row = conn.execute(
                f"SELECT {self._EX_COLS} FROM arbormem_exchanges WHERE id = %s", (exchange_id,)
            ).fetchone()
        return self._ex(row) if row else None

    def get_exchanges(self, user_id: str, ids: Sequence[str]) -> list[Exchange]:
        ids = list(dict.fromkeys(ids))
        if not ids:
            return []
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT {self._EX_COLS} FROM arbormem_exchanges "
                "WHERE user_id = %s AND id = ANY(%s) ORDER BY seq",
                (user_id, ids),
            ).fetchall()
        return [self._ex(r) for r in rows]

    def exchange_texts(self, user_id: str, ids: Sequence[str]) -> dict[str, ExchangeText]:
        ids = list(dict.fromkeys(ids))
        if not ids:
            return {}
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT id, user_text, assistant_text, tokens FROM arbormem_exchanges "
                "WHERE user_id = %s AND id = ANY(%s)",
                (user_id, ids),
            ).fetchall()
        return {r[0]: ExchangeText(r[1], r[2], r[3]) for r in rows}

    def list_exchanges(
        self, user_id: str, *, status: Status | None = None, topic_id: str | None = None,
        after_seq: int | None = None, limit: int | None = None, newest_first: bool = False,
        where: ExchangeFilter | None = None,
    ) -> list[Exchange]:
        cond, cond_params = _filter_sql(where)
        conds, params = ["user_id = %s" + cond], [user_id, *cond_params]
        if status is not None:
            conds.append("status = %s")
            params.append(status)
        if topic_id is not None:
            conds.append("topic_id = %s")
            params.append(topic_id)
        if after_seq is not None:
            conds.append("seq > %s")
            params.append(after_seq)
        sql = (
            f"SELECT {self._EX_COLS} FROM arbormem_exchanges WHERE {' AND '.join(conds)} "
            f"ORDER BY seq {'DESC' if newest_first else 'ASC'}"
        )
        if limit is not None:
            sql += f" LIMIT {max(0, int(limit))}"
        with self._conn() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [self._ex(r) for r in rows]

    def unplaced(self, user_id: str, limit: int, after_seq: int = 0) -> list[Exchange]:
        # Served by the (user_id, topic_id, seq) index: only the user's rows without a topic.
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT {self._EX_COLS} FROM arbormem_exchanges WHERE user_id = %s AND topic_id IS NULL "
                "AND seq > %s AND status = 'completed' ORDER BY seq LIMIT %s",
                (user_id, int(after_seq), max(0, int(limit))),
            ).fetchall()
        return [self._ex(r) for r in rows]

    def exchanges_by_seq(self, user_id: str, seqs: Sequence[int],
                         where: ExchangeFilter | None = None) -> list[Exchange]:
        """The user's exchanges with these sequence numbers, in one query."""
        wanted = sorted({int(s) for s in seqs})
        if not wanted:
            return []
        cond, params = _filter_sql(where)
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT {self._EX_COLS} FROM arbormem_exchanges "
                f"WHERE user_id = %s{cond} AND seq = ANY(%s) ORDER BY seq",
                (user_id, *params, wanted),
            ).fetchall()
        return [self._ex(r) for r in rows]

    def iter_exchanges(self, user_id: str, batch: int = 1000) -> Iterator[Exchange]:
        after = -(2**62)
        while True:
            rows = self.list_exchanges(user_id, after_seq=after, limit=batch)
            if not rows:
                return
            yield from rows
            after = rows[-1].seq

    def delete_exchange(self, exchange_id: str) -> None:
        with self._conn() as conn:
            self._delete_index(conn, "exchange", exchange_id)
            conn.execute("DELETE FROM arbormem_exchanges WHERE id = %s", (exchange_id,))

    def count_exchanges(self, user_id: str | None) -> dict[str, int]:
        with self._conn() as conn:
            if user_id is None:
                rows = conn.execute(
                    "SELECT status, count(*) FROM arbormem_exchanges GROUP BY status"
                ).fetchall()
            else:
                rows = conn.execute(
                    "SELECT status, count(*) FROM arbormem_exchanges WHERE user_id = %s "
                    "GROUP BY status",
                    (user_id,),
                ).fetchall()
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
            keywords=list(row[5]), summary=row[6], start_seq=row[7], end_seq=row[8],
            size=int(row[9]), first_at=row[10], last_at=row[11], frozen=bool(row[12]),
            vec_sum=np.frombuffer(bytes(row[13]), dtype=np.float32).copy() if row[13] else None,
            terms=dict(row[14]), created_seq=int(row[15]), meta=TopicMeta.decode(row[16]),
        )

    def put_topic(self, rec: TopicRecord) -> None:
        vec = rec.vec_sum.astype(np.float32).tobytes() if rec.vec_sum is not None else None
        with self._conn() as conn:
            conn.execute(
                f"INSERT INTO arbormem_topics ({self._T_COLS}) VALUES "
                "(%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) "
                "ON CONFLICT (id) DO UPDATE SET kind=excluded.kind, parent_id=excluded.parent_id, "
                "title=excluded.title, keywords=excluded.keywords, summary=excluded.summary, "
                "start_seq=excluded.start_seq, end_seq=excluded.end_seq, size=excluded.size, "
                "first_at=excluded.first_at, last_at=excluded.last_at, frozen=excluded.frozen, "
                "vec_sum=excluded.vec_sum, terms=excluded.terms, meta=excluded.meta "
                # never let one user's write replace another user's node
                "WHERE arbormem_topics.user_id = excluded.user_id",
                (
                    rec.id, rec.user_id, rec.kind, rec.parent_id, rec.title,
                    self._json(list(rec.keywords)), rec.summary, rec.start_seq, rec.end_seq,
                    rec.size, _utc(rec.first_at), _utc(rec.last_at), rec.frozen, vec,
                    self._json(dict(rec.terms)), rec.created_seq, self._json(rec.meta.encode()),
                ),
            )

    def get_topic(self, topic_id: str) -> TopicRecord | None:
        with self._conn() as conn:
            row = conn.execute(
                f"SELECT {self._T_COLS} FROM arbormem_topics WHERE id = %s", (topic_id,)
            ).fetchone()
        return self._topic(row) if row else None

    def topic_shapes(self, user_id: str, *, ids: Sequence[str] | None = None,
                     parent_id: str | None = None) -> dict[str, TopicShape]:
        cols = "id, kind, parent_id, size, vec_sum, meta"
        args: tuple[Any, ...]
        if ids is not None:
            ids = list(dict.fromkeys(ids))
            if not ids:
                return {}
            sql, args = f"SELECT {cols} FROM arbormem_topics WHERE user_id = %s AND id = ANY(%s)", (user_id, ids)
        elif parent_id is not None:
            sql = f"SELECT {cols} FROM arbormem_topics WHERE user_id = %s AND parent_id = %s ORDER BY rid"
            args = (user_id, parent_id)
        else:
            return {}
        with self._conn() as conn:
            rows = conn.execute(sql, args).fetchall()
        return {r[0]: TopicShape(r[0], r[1], r[2], int(r[3]),
                                 np.frombuffer(bytes(r[4]), dtype=np.float32).copy() if r[4] else None,
                                 no_merge_in(r[5])) for r in rows}

    def get_topics(self, user_id: str, ids: Sequence[str]) -> dict[str, TopicRecord]:
        ids = list(dict.fromkeys(ids))
        if not ids:
            return {}
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT {self._T_COLS} FROM arbormem_topics WHERE user_id = %s AND id = ANY(%s)",
                (user_id, ids),
            ).fetchall()
        return {(rec := self._topic(r)).id: rec for r in rows}

    def list_topics(
        self, user_id: str, parent_id: str | None | Literal["*"] = "*"
    ) -> list[TopicRecord]:
        base = f"SELECT {self._T_COLS} FROM arbormem_topics WHERE user_id = %s"
        with self._conn() as conn:
            if parent_id == "*":
                rows = conn.execute(base + " ORDER BY rid", (user_id,)).fetchall()
            elif parent_id is None:
                rows = conn.execute(base + " AND parent_id IS NULL ORDER BY rid", (user_id,)).fetchall()
            else:
                rows = conn.execute(
                    base + " AND parent_id = %s ORDER BY rid", (user_id, parent_id)
                ).fetchall()
        return [self._topic(r) for r in rows]

    def delete_topic(self, topic_id: str) -> None:
        with self._conn() as conn:
            self._delete_index(conn, "topic", topic_id)
            conn.execute("DELETE FROM arbormem_topics WHERE id = %s", (topic_id,))

    # -- vectors -------------------------------------------------------------------------------
    def _ensure_vector_index(self, conn: Any, dim: int) -> bool:
        """Create the HNSW index for vectors of ``dim`` dimensions, once per database; True
        when this call created it (it exists once the caller's transaction commits)."""
        tx = self._tx.get()
        if dim in self._vector_dims or (tx is not None and dim in tx.new_dims):
            return False
        name = f"arbormem_vectors_hnsw_{dim}"
        # A catalog query, not to_regclass(): that reads the backend's catalog cache, which
        # need not show an index another session committed a moment ago. And a lookup at all
        # because CREATE INDEX IF NOT EXISTS would still queue for a SHARE lock on the table
        # behind every open writer.
        exists_sql = (
            "SELECT EXISTS (SELECT 1 FROM pg_class WHERE relname = %s AND relkind = 'i' "
            "AND relnamespace = current_schema()::regnamespace)"
        )
        if not conn.execute(exists_sql, (name,)).fetchone()[0]:
            # The global DDL lock makes concurrent first writers create it once; it is held
            # to the end of this transaction, so the others then see the committed index.
            conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_LOCK_NS, _DDL_LOCK))
            if not conn.execute(exists_sql, (name,)).fetchone()[0]:
                # IF NOT EXISTS is checked after the table lock, with fresh catalogs: the
                # last guard should an index appear by another path (e.g. a manual build).
                conn.execute(
                    f"CREATE INDEX IF NOT EXISTS {name} ON arbormem_vectors USING hnsw "
                    f"((embedding::vector({dim})) vector_cosine_ops) WHERE dim = {dim}"
                )
                row = conn.execute(
                    "SELECT value FROM arbormem_meta WHERE key = 'pg_vector_dims'"
                ).fetchone()
                dims = sorted({*(int(d) for d in (row[0].split(",") if row else []) if d), dim})
                conn.execute(
                    "INSERT INTO arbormem_meta (key, value) VALUES ('pg_vector_dims', %s) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (",".join(map(str, dims)),),
                )
                # Remembered only after the commit: a rolled-back transaction (a re-embed
                # into a new dimension that failed) takes the new index with it.
                if tx is not None:
                    tx.new_dims.add(dim)
                return True
        self._vector_dims.add(dim)
        return False

    def put_vectors(self, user_id: str, kind: IndexKind, ids: Sequence[str], vectors: np.ndarray) -> None:
        _check_kind(kind)
        ids = list(ids)
        mat = np.asarray(vectors, dtype=np.float32)
        if mat.ndim != 2 or mat.shape[0] != len(ids):
            raise ValidationError(
                f"put_vectors needs one row per id: {len(ids)} ids, array of shape {mat.shape}"
            )
        if not ids:
            return
        if not np.isfinite(mat).all():
            raise ValidationError("vectors contain NaN or infinity")
        dim = int(mat.shape[1])
        with self._conn() as conn:
            created = self._ensure_vector_index(conn, dim)
            sql = (
                "INSERT INTO arbormem_vectors (kind, item_id, user_id, dim, embedding) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (kind, item_id) DO UPDATE SET "
                "dim = excluded.dim, embedding = excluded.embedding "
                "WHERE arbormem_vectors.user_id = excluded.user_id"
            )
            rows = [(kind, i, user_id, dim, v) for i, v in zip(ids, mat, strict=True)]
            if len(rows) == 1:  # the write path's usual case; executemany costs a pipeline
                conn.execute(sql, rows[0])
            else:
                with conn.cursor() as cur:
                    cur.executemany(sql, rows)
        if created and self._tx.get() is None:
            self._vector_dims.add(dim)  # its own pooled block committed

    def database_bytes(self) -> int:
        """Size of the whole database on disk (meaningful when arbormem has it to itself)."""
        with self._conn() as conn:
            return int(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0])

    # -- bulk loading: COPY (Store.load_exchanges, load_topics, finish_load) -------------------
    def load_exchanges(self, user_id: str, exchanges: Sequence[Exchange], vectors: np.ndarray,
                       keys: Sequence[str]) -> None:
        """COPY the exchange rows, their text entries (tsvector made by ``tokens``, as
        ``put_text`` makes it) and their vectors in one transaction, the BM25 statistics and
        the user's sequence counter moved once. Vector rows written before the HNSW index
        exists are indexed by ``finish_load`` in one build."""
        mat = np.asarray(vectors, dtype=np.float32)
        if mat.ndim != 2 or mat.shape[0] != len(exchanges) or len(keys) != len(exchanges):
            raise ValidationError("load_exchanges needs one vector and one key per exchange")
        if not exchanges:
            return
        if not np.isfinite(mat).all():
            raise ValidationError("vectors contain NaN or infinity")
        total_len = 0
        with self.transaction(user_id), self._conn() as conn, conn.cursor() as cur:
            with cur.copy(f"COPY arbormem_exchanges ({self._EX_COLS}, tokens) FROM STDIN") as cp:
                for ex in exchanges:
                    cp.write_row((
                        ex.id, user_id, ex.session_id, ex.seq, ex.status,
                        json.dumps(list(ex.messages), ensure_ascii=False), ex.user_text, ex.assistant_text,
                        _utc(ex.user_at), _utc(ex.assistant_at), json.dumps(dict(ex.metadata), ensure_ascii=False),
                        ex.topic_id, ex.failure, ex.archived, token_record(ex.user_text, ex.assistant_text)))
            with cur.copy("COPY arbormem_text (kind, item_id, user_id, body, tsv, doclen) FROM STDIN") as cp:
                for ex, key in zip(exchanges, keys, strict=True):
                    toks = tokens(key)
                    total_len += len(toks)
                    cp.write_row(("exchange", ex.id, user_id, key, _tsvector_literal(toks), len(toks)))
            self._add_text_stats(conn, user_id, "exchange", len(exchanges), total_len)
            conn.execute(
                "INSERT INTO arbormem_users (user_id, last_seq) VALUES (%s, %s) ON CONFLICT (user_id) DO UPDATE "
                "SET last_seq = GREATEST(arbormem_users.last_seq, excluded.last_seq)",
                (user_id, max(ex.seq for ex in exchanges)))
            self._copy_vectors(cur, user_id, "exchange", [ex.id for ex in exchanges], mat)

    def load_topics(self, user_id: str, topics: Sequence[TopicRecord], texts: Mapping[str, str]) -> None:
        """COPY the nodes, their text entries and centroids. (Through the contract each
        ``put_text`` also moves the user's one BM25 statistics row; 285k updates of one row in
        one transaction grow a version chain every later update walks, so that went quadratic.)"""
        indexed = [r for r in topics if r.id in texts]
        total_len = 0
        with self.transaction(user_id), self._conn() as conn, conn.cursor() as cur:
            with cur.copy(f"COPY arbormem_topics ({self._T_COLS}) FROM STDIN") as cp:
                for r in topics:
                    vec = r.vec_sum.astype(np.float32).tobytes() if r.vec_sum is not None else None
                    cp.write_row((r.id, user_id, r.kind, r.parent_id, r.title,
                                  json.dumps(list(r.keywords), ensure_ascii=False), r.summary, r.start_seq,
                                  r.end_seq, r.size, _utc(r.first_at), _utc(r.last_at), r.frozen, vec,
                                  json.dumps(dict(r.terms), ensure_ascii=False), r.created_seq,
                                  json.dumps(r.meta.encode(), ensure_ascii=False)))
            with cur.copy("COPY arbormem_text (kind, item_id, user_id, body, tsv, doclen) FROM STDIN") as cp:
                for r in indexed:
                    toks = tokens(texts[r.id])
                    total_len += len(toks)
                    cp.write_row(("topic", r.id, user_id, texts[r.id], _tsvector_literal(toks), len(toks)))
            self._add_text_stats(conn, user_id, "topic", len(indexed), total_len)
            with_vec = [(r.id, c) for r in indexed if (c := r.centroid()) is not None]
            if with_vec:
                self._copy_vectors(cur, user_id, "topic", [i for i, _ in with_vec], np.stack([c for _, c in with_vec]))

    def finish_load(self, user_id: str) -> None:
        """Build the HNSW index over every vector loaded (re-putting one vector makes
        ``put_vectors`` create it), then ANALYZE so the planner knows the partition's size
        (and picks the HNSW scan over an exact sort for a big one)."""
        with self._conn() as conn:
            row = conn.execute(
                "SELECT item_id, embedding FROM arbormem_vectors WHERE user_id = %s AND kind = 'exchange' LIMIT 1",
                (user_id,), binary=True).fetchone()
        if row is not None:
            with self.transaction(user_id):
                with self._conn() as conn:
                    # A build whose graph does not fit in maintenance_work_mem slows down many
                    # times (1M 384-d vectors plus topics need ~3 GB; pgvector allocates only
                    # what it uses).
                    conn.execute("SET LOCAL maintenance_work_mem = '6GB'")
                    conn.execute("SET LOCAL max_parallel_maintenance_workers = 1")
                vec = np.asarray(row[1].to_numpy(), dtype=np.float32)
                self.put_vectors(user_id, "exchange", [row[0]], vec[None, :])
        with self._conn() as conn:
            conn.execute("ANALYZE")
        for kind in _KINDS:
            self._record_common_dfs(user_id, kind)

    def _record_common_dfs(self, user_id: str, kind: str) -> None:
        """Record the document frequency of every term of the partition clearly past the
        postings cap (``text_search`` would count and record each on first meeting it; after a
        bulk load they are all known at once). The same count or page sample as
        ``_common_dfs``, so the figures are those a search would have recorded; terms near the
        cap in a sample are left for searches to count."""
        with self._conn() as conn:
            row = conn.execute("SELECT n_docs FROM arbormem_text_stats WHERE user_id = %s AND kind = %s",
                               (user_id, kind)).fetchone()
            n_docs = int(row[0]) if row else 0
            if n_docs <= _POSTINGS_CAP:
                return
            if n_docs <= _EXACT_DF_DOCS:
                dfs = {lex: int(n) for lex, n in conn.execute(
                    "SELECT u.lexeme, count(*) FROM arbormem_text t CROSS JOIN LATERAL unnest(t.tsv) u "
                    "WHERE t.user_id = %s AND t.kind = %s GROUP BY u.lexeme HAVING count(*) > %s",
                    (user_id, kind, _POSTINGS_CAP)).fetchall()}
            else:
                pct = min(100.0, 100.0 * _DF_SAMPLE / n_docs)
                sample = (f"FROM arbormem_text t TABLESAMPLE SYSTEM ({pct:.6f}) REPEATABLE (7) "
                          "WHERE t.user_id = %s AND t.kind = %s")
                sampled = max(1, int(conn.execute(f"SELECT count(*) {sample}", (user_id, kind)).fetchone()[0]))
                dfs = {}
                for lex, hits in conn.execute(
                        f"SELECT u.lexeme, count(*) FROM (SELECT t.tsv {sample}) t CROSS JOIN LATERAL unnest(t.tsv) u "
                        "GROUP BY u.lexeme", (user_id, kind)).fetchall():
                    est = round(int(hits) / sampled * n_docs)
                    if int(hits) >= 30 and est > 2 * _POSTINGS_CAP:
                        dfs[lex] = est
            self._record_dfs(conn, user_id, kind, dfs, n_docs)

    @staticmethod
    def _add_text_stats(conn: Any, user_id: str, kind: str, n_docs: int, total_len: int) -> None:
        conn.execute(
            "INSERT INTO arbormem_text_stats (user_id, kind, n_docs, total_len) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (user_id, kind) DO UPDATE SET n_docs = arbormem_text_stats.n_docs + excluded.n_docs, "
            "total_len = arbormem_text_stats.total_len + excluded.total_len", (user_id, kind, n_docs, total_len))

    @staticmethod
    def _copy_vectors(cur: Any, user_id: str, kind: str, ids: Sequence[str], mat: np.ndarray) -> None:
        with cur.copy("COPY arbormem_vectors (kind, item_id, user_id, dim, embedding) FROM STDIN "
                      "WITH (FORMAT BINARY)") as cp:
            cp.set_types(["text", "text", "text", "int4", "vector"])
            dim = int(mat.shape[1])
            for i, v in zip(ids, mat, strict=True):
                cp.write_row((kind, i, user_id, dim, v))

    def get_vectors(self, user_id: str, kind: IndexKind, ids: Sequence[str]) -> dict[str, np.ndarray]:
        _check_kind(kind)
        ids = list(dict.fromkeys(ids))
        if not ids:
            return {}
        with self._conn() as conn:
            # binary: pgvector's text form would be parsed float by float in Python
            rows = conn.execute(
                "SELECT item_id, embedding FROM arbormem_vectors "
                "WHERE user_id = %s AND kind = %s AND item_id = ANY(%s)",
                (user_id, kind, ids), binary=True,
            ).fetchall()
        return {r[0]: np.asarray(r[1].to_numpy(), dtype=np.float32) for r in rows}

    def vector_search(self, user_id: str, kind: IndexKind, query: np.ndarray, k: int,
                      where: ExchangeFilter | None = None) -> list[tuple[str, float]]:
        _check_kind(kind)
        inside, inside_params = _admitted(where, "item_id", user_id) if kind == "exchange" else ("", [])
        q = np.asarray(query, dtype=np.float32).reshape(-1)
        if k <= 0 or q.size == 0:
            return []
        dim = int(q.shape[0])
        # dim and kind are inlined: the partial index predicate (dim = D) must be provable
        # from literals, which a generic plan over parameters would not give.
        sql = (
            f"SELECT item_id, (embedding::vector({dim})) <=> %s::vector({dim}) AS d "
            f"FROM arbormem_vectors WHERE user_id = %s AND kind = '{kind}' AND dim = {dim}{inside} "
            f"ORDER BY (embedding::vector({dim})) <=> %s::vector({dim}) LIMIT {int(k)}"
        )
        with self._conn() as conn:
            # SET LOCAL: the connection is always inside a transaction here (never autocommit)
            conn.execute(f"SET LOCAL hnsw.ef_search = {min(1000, max(self.ef_search, 2 * int(k)))}")
            rows = conn.execute(sql, (q, user_id, *inside_params, q)).fetchall()
        out = [(r[0], 1.0 - float(r[1])) for r in rows]
        # relaxed_order iterative scans may return rows slightly out of order
        out.sort(key=lambda t: -t[1])
        return out

    # -- full text -----------------------------------------------------------------------------
    def put_text(self, user_id: str, kind: IndexKind, item_id: str, text: str) -> None:
        _check_kind(kind)
        toks = tokens(text)
        table = "arbormem_exchanges" if kind == "exchange" else "arbormem_topics"
        # One round trip (this runs for every exchange and every touched topic): upsert the
        # entry if the item exists for this user, and move the BM25 stats by the difference.
        with self._conn() as conn:
            row = conn.execute(
                f"WITH owner AS (SELECT 1 FROM {table} WHERE id = %(id)s AND user_id = %(u)s), "
                "old AS (SELECT doclen FROM arbormem_text WHERE kind = %(k)s AND item_id = %(id)s), "
                "up AS (INSERT INTO arbormem_text (kind, item_id, user_id, body, tsv, doclen) "
                "SELECT %(k)s, %(id)s, %(u)s, %(body)s, %(tsv)s::tsvector, %(len)s FROM owner "
                "ON CONFLICT (kind, item_id) DO UPDATE SET user_id = excluded.user_id, "
                "body = excluded.body, tsv = excluded.tsv, doclen = excluded.doclen "
                "RETURNING doclen) "
                "INSERT INTO arbormem_text_stats (user_id, kind, n_docs, total_len) "
                "SELECT %(u)s, %(k)s, 1 - (SELECT count(*) FROM old), "
                "up.doclen - coalesce((SELECT sum(doclen) FROM old), 0) FROM up "
                "ON CONFLICT (user_id, kind) DO UPDATE SET "
                "n_docs = arbormem_text_stats.n_docs + excluded.n_docs, "
                "total_len = arbormem_text_stats.total_len + excluded.total_len "
                "RETURNING arbormem_text_stats.n_docs, (SELECT count(*) FROM old)",
                {"id": item_id, "u": user_id, "k": kind, "body": text,
                 "tsv": _tsvector_literal(toks), "len": len(toks)},
            ).fetchone()
            if row is not None and not row[1] and _needs_analyze(int(row[0])):
                # The planner must know how big this partition has become: with statistics
                # from when it was small (or none: autovacuum may not have reached a table
                # filled in a minute) it expects a handful of rows for (user_id, kind),
                # reads them through the btree and tests every one against each query term,
                # instead of using the GIN index. That made recall at 10k after real ingest
                # 265 ms p50 instead of 139 ms; ANALYZE takes ~0.1 s at that size.
                conn.execute("ANALYZE arbormem_text")
        if row is None:
            raise StoreError(f"no {kind} {item_id!r} of this user to index")

    def _remove_text(self, conn: Any, kind: str, item_id: str) -> None:
        row = conn.execute(
            "DELETE FROM arbormem_text WHERE kind = %s AND item_id = %s RETURNING user_id, doclen",
            (kind, item_id),
        ).fetchone()
        if row is not None:
            conn.execute(
                "UPDATE arbormem_text_stats SET n_docs = n_docs - 1, total_len = total_len - %s "
                "WHERE user_id = %s AND kind = %s",
                (row[1], row[0], kind),
            )

    @staticmethod
    def _matching(kind: str, owner: bool) -> tuple[str, str]:
        """FROM and WHERE parts selecting the user's rows of ``kind`` that match a tsquery,
        parameters (tsquery, user_id) in that order. The kind is a literal so the planner can
        use that kind's partial GIN index (migration 5). For a user holding most of the kind's
        rows (``owner``) the user filter is kept outside an ``OFFSET 0`` fence: inside, the
        planner ANDed the GIN bitmap with the (user_id, kind) btree, which reads one entry per
        row of the partition (44-68 ms per rare term over 286k topics at 1M exchanges) to
        exclude nothing. A smaller user keeps it inside, where that btree narrows the search."""
        if owner:
            return (f"(SELECT * FROM arbormem_text WHERE kind = '{kind}' AND tsv @@ %s::tsquery OFFSET 0) t",
                    "t.user_id = %s")
        return "arbormem_text t", f"t.kind = '{kind}' AND t.tsv @@ %s::tsquery AND t.user_id = %s"

    # Long: one SQL statement (BM25 over tsvector with the filters) and its parameters.
    def text_search(self, user_id: str, kind: IndexKind, terms: Sequence[str], k: int,
                    where: ExchangeFilter | None = None) -> list[tuple[str, float]]:
        _check_kind(kind)
        # A filter restricts the postings read (document statistics stay the partition's).
        inside, inside_params = _admitted(where, "t.item_id", user_id) if kind == "exchange" else ("", [])
        lexemes = list(dict.fromkeys(t for term in terms for t in tokens(term)))
        if not lexemes or k <= 0:
            return []
        with self._conn() as conn:
            # No parallel workers: these statements are small (bounded postings), and for
            # commonplace terms the planner would split them over Gather workers whose start
            # cost more than they save: recall at 10k took 147 ms p50 with them, 98 ms without
            # (BENCHMARKS.md, "Real ingest path at 10k"). No sequential scans: every statement
            # here is meant to read postings or rows by key; with a LIMIT the planner took a
            # common term for evenly spread and scanned the table for it, but the rows are in
            # insertion order (the topic rows of a bulk load after all its exchanges: 317 ms
            # for one term at 1M). SET LOCAL, as in vector_search.
            conn.execute("SET LOCAL max_parallel_workers_per_gather = 0")
            conn.execute("SET LOCAL enable_seqscan = off")
            stats = conn.execute(
                "SELECT n_docs, total_len, (SELECT sum(n_docs) FROM arbormem_text_stats WHERE kind = %s) "
                "FROM arbormem_text_stats WHERE user_id = %s AND kind = %s",
                (kind, user_id, kind),
            ).fetchone()
            if stats is None or stats[0] <= 0:
                return []
            n_docs, avgdl = int(stats[0]), max(1.0, stats[1] / stats[0])
            owner = 2 * n_docs >= int(stats[2] or 0)
            src, cond = self._matching(kind, owner)
            # 0. Common terms whose document frequency is recorded (arbormem_text_df) for about
            #    this partition size need no count: counting even up to the cap reads a GIN
            #    bitmap of all their postings first (~40 ms for a name in 155k documents).
            known = self._recorded_dfs(conn, user_id, kind, lexemes, n_docs)
            # 1. How many documents hold each other term, counted up to cap+1. One branch per
            #    term with the term as a constant, so the planner sees its selectivity and takes
            #    the GIN index (a lateral join over an array of terms hid it and scanned the
            #    whole partition per term).
            q = "'{}'"
            todo = [lex for lex in lexemes if lex not in known]
            capped: dict[str, int] = {}
            params: list[Any] = []
            if todo:
                union = " UNION ALL ".join(
                    f"SELECT %s::text, (SELECT count(*) FROM (SELECT 1 FROM {src} WHERE {cond} LIMIT %s) s)"
                    for _ in todo
                )
                for lex in todo:
                    params += [lex, q.format(lex), user_id, _POSTINGS_CAP + 1]
                capped = dict(conn.execute(union, params, prepare=False).fetchall())
            rare = [lex for lex in todo if 0 < capped[lex] <= _POSTINGS_CAP]
            common = [lex for lex in lexemes if lex in known or capped[lex] > _POSTINGS_CAP]
            df = Counter({lex: int(capped[lex]) for lex in rare})
            # 2. Every posting of the rare terms, with its term frequency.
            postings: list[tuple[str, int, str, int]] = []
            if rare:
                union = " UNION ALL ".join(
                    "SELECT t.item_id, t.doclen, u.lexeme, cardinality(u.positions) "
                    f"FROM {src} CROSS JOIN LATERAL unnest(t.tsv) u WHERE {cond} AND u.lexeme = %s{inside}"
                    for _ in rare
                )
                params = []
                for lex in rare:
                    params += [q.format(lex), user_id, lex, *inside_params]
                postings = conn.execute(union, params, prepare=False).fetchall()
            def idf(lex: str) -> float:
                # Lucene's BM25 idf (always positive); document stats are per user and kind
                n = df[lex]
                return math.log((n_docs - n + 0.5) / (n + 0.5) + 1.0)

            def add(scores: dict[str, float], rows: Sequence[tuple[str, int, str, int]]) -> None:
                for item_id, doclen, lex, tf in rows:
                    norm = tf + _BM25_K1 * (1.0 - _BM25_B + _BM25_B * doclen / avgdl)
                    scores[item_id] = scores.get(item_id, 0.0) + idf(lex) * tf * (_BM25_K1 + 1.0) / norm

            scores: dict[str, float] = {}
            add(scores, postings)
            if common:
                # 3. A term in more documents than the cap weighs little (low idf); reading all
                #    its postings would make search linear in the partition. Its document
                #    frequency is counted or estimated once and recorded (see _common_dfs). As
                #    in MaxScore, a document can gain at most idf * (k1 + 1) per common term, so
                #    only documents whose rare-term score plus that bound reaches the k-th best
                #    rare-term score are rescored — exact when the rare terms found k
                #    documents. Documents holding every common term join the candidates
                #    (topped up from the rarest common term while there are fewer than 4k).
                df.update(known)
                df.update(self._common_dfs(conn, user_id, kind, [c for c in common if c not in known], n_docs))
                bound = sum(idf(lex) for lex in common) * (_BM25_K1 + 1.0)
                partial = sorted(scores.values(), reverse=True)
                kth = partial[k - 1] if len(partial) >= k else 0.0
                docs = {i for i, sc in scores.items() if sc + bound >= kth}
                want = max(4 * int(k), 50)
                if bound >= kth:
                    tsqs = [" & ".join(f"'{lex}'" for lex in common)]
                    if len(common) > 1:
                        tsqs += [f"'{lex}'" for lex in sorted(common, key=lambda x: df[x])]
                    found: set[str] = set()
                    for n, tsq in enumerate(tsqs):
                        if n and len(found) >= want:
                            break
                        found.update(r[0] for r in conn.execute(
                            f"SELECT t.item_id FROM {src} WHERE {cond}{inside} LIMIT %s",
                            (tsq, user_id, *inside_params, want),
                        ).fetchall())
                    docs |= found
                if docs:
                    add(scores, conn.execute(
                        "SELECT t.item_id, t.doclen, u.lexeme, cardinality(u.positions) "
                        "FROM arbormem_text t CROSS JOIN LATERAL unnest(t.tsv) u "
                        f"WHERE t.kind = '{kind}' AND t.item_id = ANY(%s) AND t.user_id = %s "
                        "AND u.lexeme = ANY(%s)",
                        (list(docs), user_id, common),
                    ).fetchall())
            ranked = sorted(scores.items(), key=lambda t: -t[1])
            if len(ranked) > k:
                # keep every item tied with the last one kept, for the tie-break below
                floor = round(ranked[k - 1][1], 9)
                ranked = [r for r in ranked if round(r[1], 9) >= floor]
            # Equal scores (same text) rank in item order, as FTS5 ranks by rowid: oldest first.
            table, col = ("arbormem_exchanges", "seq") if kind == "exchange" else ("arbormem_topics", "rid")
            order = dict(conn.execute(
                f"SELECT id, {col} FROM {table} WHERE user_id = %s AND id = ANY(%s)",
                (user_id, [r[0] for r in ranked]),
            ).fetchall())
        ranked.sort(key=lambda t: (-round(t[1], 9), order.get(t[0], 0), t[0]))
        return ranked[: int(k)]

    @staticmethod
    def _recorded_dfs(conn: Any, user_id: str, kind: str, lexemes: list[str], n_docs: int) -> dict[str, int]:
        """Recorded document frequencies of common terms, for a partition of about the size
        they were estimated at (up to 10% bigger; a smaller one means deletions: count again)."""
        rows = conn.execute(
            "SELECT lexeme, df FROM arbormem_text_df WHERE user_id = %s AND kind = %s AND lexeme = ANY(%s) "
            "AND n_docs <= %s AND %s <= n_docs * 1.1",
            (user_id, kind, lexemes, n_docs, n_docs),
        ).fetchall()
        return {r[0]: int(r[1]) for r in rows}

    def _common_dfs(self, conn: Any, user_id: str, kind: str, lexemes: list[str], n_docs: int) -> dict[str, int]:
        """Document frequencies of common terms: counted in small partitions, estimated from
        a page sample in big ones (their idf is low and needs no precision, while an exact
        count reads every matching row); recorded in arbormem_text_df for later searches
        (from any process) until the partition grows by 10%."""
        out: dict[str, int] = {}
        if not lexemes:
            return out
        if n_docs <= _EXACT_DF_DOCS:
            for lex in lexemes:
                out[lex] = int(conn.execute(
                    f"SELECT count(*) FROM arbormem_text WHERE kind = '{kind}' AND user_id = %s "
                    "AND tsv @@ %s::tsquery",
                    (user_id, f"'{lex}'"),
                ).fetchone()[0])
        else:
            # SYSTEM sampling takes whole random pages: unbiased over the partition's history,
            # about _DF_SAMPLE of the user's documents, one pass for all the terms.
            pct = min(100.0, 100.0 * _DF_SAMPLE / n_docs)
            filters = ", ".join("count(*) FILTER (WHERE tsv @@ %s::tsquery)" for _ in lexemes)
            row = conn.execute(
                f"SELECT count(*), {filters} FROM arbormem_text TABLESAMPLE SYSTEM ({pct:.6f}) "
                "REPEATABLE (7) WHERE user_id = %s AND kind = %s",
                [*(f"'{lex}'" for lex in lexemes), user_id, kind],
                prepare=False,
            ).fetchone()
            sampled = max(1, int(row[0]))
            for lex, hits in zip(lexemes, row[1:], strict=True):
                # a common term holds more than the cap by definition
                out[lex] = max(_POSTINGS_CAP + 1, round(int(hits) / sampled * n_docs))
        self._record_dfs(conn, user_id, kind, out, n_docs)
        return out

    def _record_dfs(self, conn: Any, user_id: str, kind: str, dfs: Mapping[str, int], n_docs: int) -> None:
        """Upsert common terms' document frequencies. In a savepoint: a read-only session (a
        replica, a read-only role) still searches, it only counts again next time. Sorted, so
        two searches recording the same terms lock their rows in one order."""
        if not dfs:
            return
        try:
            with conn.transaction():
                with conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO arbormem_text_df (user_id, kind, lexeme, df, n_docs) VALUES (%s, %s, %s, %s, %s) "
                        "ON CONFLICT (user_id, kind, lexeme) DO UPDATE SET df = excluded.df, n_docs = excluded.n_docs",
                        [(user_id, kind, lex, int(dfs[lex]), n_docs) for lex in sorted(dfs)],
                    )
        except self._psycopg.Error:
            pass

    def delete_index(self, kind: IndexKind, item_id: str) -> None:
        _check_kind(kind)
        with self._conn() as conn:
            self._delete_index(conn, kind, item_id)

    def _delete_index(self, conn: Any, kind: str, item_id: str) -> None:
        self._remove_text(conn, kind, item_id)
        conn.execute("DELETE FROM arbormem_vectors WHERE kind = %s AND item_id = %s", (kind, item_id))

    # -- bulk export (used by ``migrate.copy_store``) ----------------------------------------------
    def iter_text(self, user_id: str, kind: IndexKind) -> Iterator[tuple[str, str]]:
        """Every (item_id, indexed text) of the user's text index of ``kind``, by item id."""
        _check_kind(kind)
        after = ""
        while True:
            with self._conn() as conn:
                rows = conn.execute(
                    "SELECT item_id, body FROM arbormem_text WHERE user_id = %s AND kind = %s "
                    "AND item_id > %s ORDER BY item_id LIMIT 1000",
                    (user_id, kind, after),
                ).fetchall()
            if not rows:
                return
            yield from ((r[0], r[1]) for r in rows)
            after = rows[-1][0]

    def iter_vector_ids(self, user_id: str, kind: IndexKind) -> list[str]:
        """Ids of every vector of the user of ``kind`` (sorted)."""
        _check_kind(kind)
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT item_id FROM arbormem_vectors WHERE user_id = %s AND kind = %s ORDER BY item_id",
                (user_id, kind),
            ).fetchall()
        return [r[0] for r in rows]

    def iter_term_df(self, user_id: str) -> list[tuple[str, int]]:
        """Every (term, document frequency) of the user, sorted by term."""
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT term, df FROM arbormem_term_df WHERE user_id = %s ORDER BY term", (user_id,)
            ).fetchall()
        return [(r[0], int(r[1])) for r in rows]

    def iter_meta(self) -> list[tuple[str, str]]:
        """Every (key, value) of the store's meta table."""
        with self._conn() as conn:
            rows = conn.execute("SELECT key, value FROM arbormem_meta ORDER BY key").fetchall()
        return [(r[0], r[1]) for r in rows]

    def get_last_seq(self, user_id: str) -> int:
        """The user's last allocated sequence number (0 for a new user)."""
        with self._conn() as conn:
            row = conn.execute(
                "SELECT last_seq FROM arbormem_users WHERE user_id = %s", (user_id,)
            ).fetchone()
        return int(row[0]) if row else 0

    def ensure_seq(self, user_id: str, seq: int) -> None:
        """Raise the user's sequence counter to at least ``seq`` (never lowers it)."""
        with self._conn() as conn:
            conn.execute(
                "INSERT INTO arbormem_users (user_id, last_seq) VALUES (%s, %s) "
                "ON CONFLICT (user_id) DO UPDATE SET last_seq = "
                "GREATEST(arbormem_users.last_seq, excluded.last_seq)",
                (user_id, int(seq)),
            )

    def put_change(self, rec: ChangeRecord) -> None:
        """Insert a change record as is (id and time kept): the import side of the audit log."""
        with self._conn() as conn:
            conn.execute(
                "INSERT INTO arbormem_changes (id, user_id, at, action, target_id, detail) "
                "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING",
                (rec.id, rec.user_id, _utc(rec.at), rec.action, rec.target_id, self._json(rec.detail)),
            )

    # -- term statistics -------------------------------------------------------------------------
    def add_term_df(self, user_id: str, terms: Sequence[str], delta: int = 1) -> None:
        distinct = sorted(set(terms))  # sorted: concurrent upserts lock rows in one order
        if not distinct:
            return
        with self._conn() as conn:
            conn.execute(
                "INSERT INTO arbormem_term_df (user_id, term, df) "
                "SELECT %s, t, GREATEST(0, %s) FROM unnest(%s::text[]) AS t "
                "ON CONFLICT (user_id, term) DO UPDATE SET "
                "df = GREATEST(0, arbormem_term_df.df + %s)",
                (user_id, int(delta), distinct, int(delta)),
            )

    def get_term_df(self, user_id: str, terms: Sequence[str]) -> dict[str, int]:
        distinct = list(set(terms))
        if not distinct:
            return {}
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT term, df FROM arbormem_term_df WHERE user_id = %s AND term = ANY(%s)",
                (user_id, distinct),
            ).fetchall()
        return {r[0]: int(r[1]) for r in rows}

    # -- users and audit -------------------------------------------------------------------------
    def list_users(self) -> list[str]:
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT u.user_id FROM arbormem_users u WHERE EXISTS "
                "(SELECT 1 FROM arbormem_exchanges e WHERE e.user_id = u.user_id) ORDER BY 1"
            ).fetchall()
        return [r[0] for r in rows]

    def delete_user(self, user_id: str) -> int:
        with self.transaction(user_id), self._conn() as conn:
            n = conn.execute(
                "DELETE FROM arbormem_exchanges WHERE user_id = %s", (user_id,)
            ).rowcount
            for table in (
                "arbormem_topics", "arbormem_vectors", "arbormem_text", "arbormem_text_stats",
                "arbormem_text_df", "arbormem_term_df", "arbormem_changes", "arbormem_users",
            ):
                conn.execute(f"DELETE FROM {table} WHERE user_id = %s", (user_id,))
        return int(n)

    def purge_deleted_text(self) -> None:
        # A term no exchange of the user uses any more (df 0) is a word of the deleted text.
        # (Deleted tuples stay in the table files until VACUUM reclaims them and in WAL until it
        # is recycled: PostgreSQL has no secure delete; docs/robustness.md.)
        tx = self._tx.get()
        if tx is None:
            return
        with self._conn() as conn:
            conn.execute("DELETE FROM arbormem_term_df WHERE user_id = ANY(%s) AND df <= 0",
                         (sorted(tx.users),))
            # Recorded common-term frequencies from before the deletions (a search would count
            # them again anyway): a term in that many documents is not one text's word, but a
            # large forget may leave it in none.
            conn.execute("DELETE FROM arbormem_text_df d USING arbormem_text_stats s WHERE d.user_id = ANY(%s) "
                         "AND s.user_id = d.user_id AND s.kind = d.kind AND d.n_docs > s.n_docs",
                         (sorted(tx.users),))

    def log_change(self, user_id: str, action: str, target_id: str, detail: dict[str, Any]) -> str:
        change_id = "c_" + uuid.uuid4().hex
        with self._conn() as conn:
            conn.execute(
                "INSERT INTO arbormem_changes (id, user_id, at, action, target_id, detail) "
                "VALUES (%s, %s, %s, %s, %s, %s)",
                (change_id, user_id, datetime.now(timezone.utc), action, target_id, self._json(detail)),
            )
        return change_id

    def list_changes(self, user_id: str, target_id: str | None = None, limit: int = 100) -> list[ChangeRecord]:
        sql = "SELECT id, user_id, at, action, target_id, detail FROM arbormem_changes WHERE user_id = %s"
        params: list[Any] = [user_id]
        if target_id is not None:
            sql += " AND target_id = %s"
            params.append(target_id)
        sql += " ORDER BY rid DESC LIMIT %s"
        params.append(int(limit))
        with self._conn() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [
            ChangeRecord(id=r[0], user_id=r[1], at=r[2], action=r[3], target_id=r[4], detail=dict(r[5]))
            for r in rows
        ]


def _dumps(value: Any) -> str:
    # default=str as in SQLiteStore: audit details may carry datetimes or other plain objects.
    return json.dumps(value, ensure_ascii=False, default=str)


def _redact(url: str) -> str:
    """The URL without its password (for messages and reprs)."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)
