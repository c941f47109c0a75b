"""Numbered, ordered schema migrations for the PostgreSQL store.

Each entry is applied once, in order, inside one transaction holding a global advisory lock
(so many processes opening the same database at once apply it exactly once), and recorded in
``arbormem_schema_migrations``. Never edit a released migration: add a new one.

Every table is prefixed ``arbormem_`` so the store can live in an application's existing
database. Vector indexes are not created here: HNSW needs a fixed dimension, which is only
known at the first ``put_vectors`` (see ``PostgresStore._ensure_vector_index``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# (version, name, SQL script or a Python step called with the migration's connection)
PG_MIGRATIONS: list[tuple[int, str, str | Callable[[Any], None]]] = [
    (
        1,
        "initial schema",
        """
        CREATE EXTENSION IF NOT EXISTS vector;

        CREATE TABLE arbormem_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);

        -- One row per user: the sequence counter (allocated under the user's advisory lock,
        -- and row-locked by the UPDATE itself, so two writers can never get the same number).
        CREATE TABLE arbormem_users (
            user_id  TEXT PRIMARY KEY,
            last_seq BIGINT NOT NULL DEFAULT 0
        );

        CREATE TABLE arbormem_exchanges (
            id             TEXT PRIMARY KEY,
            user_id        TEXT NOT NULL,
            session_id     TEXT,
            seq            BIGINT NOT NULL,
            status         TEXT NOT NULL CHECK (status IN ('pending', 'completed', 'failed')),
            messages       JSON NOT NULL,          -- json (not jsonb): kept verbatim, key order too
            user_text      TEXT NOT NULL,
            assistant_text TEXT NOT NULL DEFAULT '',
            user_at        TIMESTAMPTZ NOT NULL,
            assistant_at   TIMESTAMPTZ,
            metadata       JSON NOT NULL,
            topic_id       TEXT,
            failure        TEXT,
            archived       BOOLEAN NOT NULL DEFAULT false,
            UNIQUE (user_id, seq)
        );
        CREATE INDEX arbormem_exchanges_user_topic ON arbormem_exchanges (user_id, topic_id, seq);
        CREATE INDEX arbormem_exchanges_user_status ON arbormem_exchanges (user_id, status, seq);

        CREATE TABLE arbormem_topics (
            rid         BIGSERIAL UNIQUE,          -- insertion order, as list_topics returns it
            id          TEXT PRIMARY KEY,
            user_id     TEXT NOT NULL,
            kind        TEXT NOT NULL,
            parent_id   TEXT,
            title       TEXT NOT NULL DEFAULT '',
            keywords    JSON NOT NULL,
            summary     TEXT NOT NULL DEFAULT '',
            start_seq   BIGINT,
            end_seq     BIGINT,
            size        INTEGER NOT NULL DEFAULT 0,
            first_at    TIMESTAMPTZ,
            last_at     TIMESTAMPTZ,
            frozen      BOOLEAN NOT NULL DEFAULT false,
            vec_sum     BYTEA,                     -- float32 little-endian, as in SQLite
            terms       JSON NOT NULL,
            created_seq BIGINT NOT NULL DEFAULT 0,
            meta        JSON NOT NULL
        );
        CREATE INDEX arbormem_topics_user_parent ON arbormem_topics (user_id, parent_id, rid);
        CREATE INDEX arbormem_topics_user_rid ON arbormem_topics (user_id, rid);

        -- Dimension-less column: the HNSW index is a partial expression index per dimension,
        -- ((embedding::vector(D)) vector_cosine_ops) WHERE dim = D, created on first use.
        CREATE TABLE arbormem_vectors (
            kind      TEXT NOT NULL,
            item_id   TEXT NOT NULL,
            user_id   TEXT NOT NULL,
            dim       INTEGER NOT NULL,
            embedding vector NOT NULL,
            PRIMARY KEY (kind, item_id)
        );
        CREATE INDEX arbormem_vectors_user ON arbormem_vectors (user_id, kind, dim);

        -- Lexical index. The tsvector is built by arbormem (Unicode word tokens, lower-cased,
        -- diacritics stripped, positions kept) rather than by a PostgreSQL text-search config,
        -- so tokens are identical whatever the server's locale, and match FTS5's unicode61.
        CREATE TABLE arbormem_text (
            kind    TEXT NOT NULL,
            item_id TEXT NOT NULL,
            user_id TEXT NOT NULL,
            body    TEXT NOT NULL,
            tsv     TSVECTOR NOT NULL,
            doclen  INTEGER NOT NULL,
            PRIMARY KEY (kind, item_id)
        );
        CREATE INDEX arbormem_text_user ON arbormem_text (user_id, kind);
        CREATE INDEX arbormem_text_tsv ON arbormem_text USING gin (tsv);

        -- BM25 needs the number of documents and their total length per (user, kind).
        CREATE TABLE arbormem_text_stats (
            user_id   TEXT NOT NULL,
            kind      TEXT NOT NULL,
            n_docs    BIGINT NOT NULL DEFAULT 0,
            total_len BIGINT NOT NULL DEFAULT 0,
            PRIMARY KEY (user_id, kind)
        );

        CREATE TABLE arbormem_term_df (
            user_id TEXT NOT NULL,
            term    TEXT NOT NULL,
            df      BIGINT NOT NULL,
            PRIMARY KEY (user_id, term)
        );

        CREATE TABLE arbormem_changes (
            rid       BIGSERIAL UNIQUE,
            id        TEXT PRIMARY KEY,
            user_id   TEXT NOT NULL,
            at        TIMESTAMPTZ NOT NULL,
            action    TEXT NOT NULL,
            target_id TEXT NOT NULL,
            detail    JSON NOT NULL
        );
        CREATE INDEX arbormem_changes_user ON arbormem_changes (user_id, rid);
        CREATE INDEX arbormem_changes_user_target ON arbormem_changes (user_id, target_id, rid);
        """,
    ),
    (
        2,
        "stemmed lexical index (porter)",
        # Python, because arbormem builds the tokens itself (postgres.tokens).
        lambda conn: _restem(conn),
    ),
    (
        3,
        "lexical GIN index without a pending list (fastupdate off)",
        # With fastupdate on (the default), new index entries wait in an unsorted pending list
        # of up to gin_pending_list_limit (4 MB) that every search reads in full until
        # VACUUM, autoanalyze or an overflow merges it. The write path writes ~5 index rows
        # per exchange (its own key, its neighbour's, the touched topics: 21.8k inserts and
        # 28.6k updates for 10k exchanges), so after real ingest the list was often hundreds
        # of pages: recall at 10k took 155.5 ms p50 with 268 pending pages and 112.8 ms once
        # flushed (BENCHMARKS.md, "Real ingest path at 10k"). Off, entries go straight into
        # the index, and 10k exchanges ingested in the same time (70-73 s vs 68-78 s). The
        # flush clears a list left by earlier writes.
        """
        ALTER INDEX arbormem_text_tsv SET (fastupdate = off);
        SELECT gin_clean_pending_list('arbormem_text_tsv'::regclass);
        """,
    ),
    (
        5,
        "lexical GIN index per kind; recorded document frequencies of common terms",
        # One GIN index over both kinds made a topic search read the exchanges' postings of
        # each term too (a name in 155k exchanges and few topics: ~40 ms to build its bitmap
        # at 1M exchanges, then ~1M heap rows filtered out by kind). A partial index per kind
        # holds only that kind's postings (queries name the kind as a literal so the planner
        # can use it). arbormem_text_df keeps, per (user, kind), the estimated document
        # frequency of each lexeme found in more than PostgresStore's postings cap, and the
        # partition size it was estimated at: a search then knows a common term without
        # reading its postings (which grow with the partition); see text_search.
        """
        CREATE INDEX IF NOT EXISTS arbormem_text_tsv_exchange ON arbormem_text USING gin (tsv)
            WITH (fastupdate = off) WHERE kind = 'exchange';
        CREATE INDEX IF NOT EXISTS arbormem_text_tsv_topic ON arbormem_text USING gin (tsv)
            WITH (fastupdate = off) WHERE kind = 'topic';
        DROP INDEX IF EXISTS arbormem_text_tsv;
        CREATE TABLE arbormem_text_df (
            user_id TEXT NOT NULL,
            kind    TEXT NOT NULL,
            lexeme  TEXT NOT NULL,
            df      BIGINT NOT NULL,
            n_docs  BIGINT NOT NULL,  -- the partition's size when df was estimated
            PRIMARY KEY (user_id, kind, lexeme)
        );
        """,
    ),
    (
        6,
        "tokens kept beside an exchange's text",
        # As SQLite's migration 5: ``text.token_record`` of the two texts, written with them,
        # read by recall's coverage and feedback steps; older rows stay NULL (tokenised when
        # read).
        """
        ALTER TABLE arbormem_exchanges ADD COLUMN IF NOT EXISTS tokens TEXT;
        """,
    ),
]


def _restem(conn: Any) -> None:
    from .postgres import restem_text_index  # postgres.py imports this module

    restem_text_index(conn)
