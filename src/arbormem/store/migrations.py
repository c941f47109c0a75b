"""Numbered, ordered schema migrations for the SQLite store.

Each entry is applied once, in order, inside one transaction, and recorded in
``schema_migrations``. Never edit a released migration: add a new one.
"""

from __future__ import annotations

SQLITE_MIGRATIONS: list[tuple[int, str, str]] = [
    (
        1,
        "initial schema",
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);

        CREATE TABLE user_state (
            user_id  TEXT PRIMARY KEY,
            last_seq INTEGER NOT NULL DEFAULT 0,
            del_gen  INTEGER NOT NULL DEFAULT 0   -- bumped when vectors are deleted (cache check)
        );

        CREATE TABLE exchanges (
            rid          INTEGER PRIMARY KEY,
            id           TEXT NOT NULL UNIQUE,
            user_id      TEXT NOT NULL,
            session_id   TEXT,
            seq          INTEGER NOT NULL,
            status       TEXT NOT NULL CHECK (status IN ('pending', 'completed', 'failed')),
            messages     TEXT NOT NULL,            -- JSON, verbatim
            user_text    TEXT NOT NULL,
            assistant_text TEXT NOT NULL DEFAULT '',
            user_at      TEXT NOT NULL,
            assistant_at TEXT,
            metadata     TEXT NOT NULL DEFAULT '{}',
            topic_id     TEXT,
            failure      TEXT,
            archived     INTEGER NOT NULL DEFAULT 0,
            UNIQUE (user_id, seq)
        );
        CREATE INDEX exchanges_topic ON exchanges (topic_id);

        CREATE TABLE topics (
            rid        INTEGER PRIMARY KEY,
            id         TEXT NOT NULL UNIQUE,
            user_id    TEXT NOT NULL,
            kind       TEXT NOT NULL,
            parent_id  TEXT,
            title      TEXT NOT NULL DEFAULT '',
            keywords   TEXT NOT NULL DEFAULT '[]',
            summary    TEXT NOT NULL DEFAULT '',
            start_seq  INTEGER,
            end_seq    INTEGER,
            size       INTEGER NOT NULL DEFAULT 0,
            first_at   TEXT,
            last_at    TEXT,
            frozen     INTEGER NOT NULL DEFAULT 0,
            vec_sum    BLOB,
            terms      TEXT NOT NULL DEFAULT '{}',
            created_seq INTEGER NOT NULL DEFAULT 0,
            meta       TEXT NOT NULL DEFAULT '{}'
        );
        CREATE INDEX topics_user_parent ON topics (user_id, parent_id);

        CREATE TABLE vectors (
            rid     INTEGER PRIMARY KEY,
            kind    TEXT NOT NULL,
            item_id TEXT NOT NULL,
            user_id TEXT NOT NULL,
            vec     BLOB NOT NULL,
            UNIQUE (kind, item_id)
        );
        CREATE INDEX vectors_user ON vectors (user_id, kind, rid);

        -- One full-text table per kind; ``uid`` holds a per-user token so the user filter is
        -- part of the MATCH (FTS intersects it) instead of a post-filter over every match.
        -- rowid = exchanges.rid / topics.rid.
        CREATE VIRTUAL TABLE exchange_fts USING fts5 (
            uid, body, tokenize = 'unicode61 remove_diacritics 2'
        );
        CREATE VIRTUAL TABLE topic_fts USING fts5 (
            uid, body, tokenize = 'unicode61 remove_diacritics 2'
        );

        CREATE TABLE term_df (
            user_id TEXT NOT NULL,
            term    TEXT NOT NULL,
            df      INTEGER NOT NULL,
            PRIMARY KEY (user_id, term)
        ) WITHOUT ROWID;

        CREATE TABLE changes (
            rid       INTEGER PRIMARY KEY,
            id        TEXT NOT NULL UNIQUE,
            user_id   TEXT NOT NULL,
            at        TEXT NOT NULL,
            action    TEXT NOT NULL,
            target_id TEXT NOT NULL,
            detail    TEXT NOT NULL DEFAULT '{}'
        );
        CREATE INDEX changes_user_target ON changes (user_id, target_id);
        """,
    ),
    (
        2,
        "exchanges by (user, topic, seq)",
        # Without it SQLite answers "the exchanges of topic T" through the (user_id, seq)
        # index, scanning every exchange of the user: ~3 ms per topic at 10k exchanges, paid by
        # every summary and every merge. PostgreSQL's schema has had this index from the start.
        """
        CREATE INDEX exchanges_user_topic ON exchanges (user_id, topic_id, seq);
        """,
    ),
    (
        3,
        "stemmed full-text index (porter)",
        # "research" should find "Researching": on the LoCoMo development split stemming
        # raised evidence recall by ~0.5 point at 2,048 tokens and ~1 point at 4,096
        # (docs/recall.md). The same rules apply to query strings inside MATCH. FTS5 tables
        # keep their text, so the rows are copied, not recomputed. (The per-user uid token
        # is stemmed too, index and query alike: two users could only collide if their
        # SHA-1 prefixes agreed in the first 18 hex digits.)
        """
        CREATE VIRTUAL TABLE exchange_fts_v3 USING fts5 (
            uid, body, tokenize = 'porter unicode61 remove_diacritics 2'
        );
        INSERT INTO exchange_fts_v3 (rowid, uid, body) SELECT rowid, uid, body FROM exchange_fts;
        DROP TABLE exchange_fts;
        ALTER TABLE exchange_fts_v3 RENAME TO exchange_fts;
        CREATE VIRTUAL TABLE topic_fts_v3 USING fts5 (
            uid, body, tokenize = 'porter unicode61 remove_diacritics 2'
        );
        INSERT INTO topic_fts_v3 (rowid, uid, body) SELECT rowid, uid, body FROM topic_fts;
        DROP TABLE topic_fts;
        ALTER TABLE topic_fts_v3 RENAME TO topic_fts;
        """,
    ),
    (
        4,
        "count in-place vector rewrites per partition",
        # A vector rewritten in place keeps its rowid, so rowids and counts cannot show it.
        # The store saves a large partition's vector cache beside the database and trusts it
        # on the next open only if this count (and the row count, highest rowid, deletion
        # generation) is unchanged. A trigger, so that any writer - raw SQL included - counts.
        # (Deletions need none: they lower the row count below the saved highest rowid.)
        """
        CREATE TRIGGER vectors_rewritten AFTER UPDATE OF vec, rid, item_id, user_id, kind ON vectors
        BEGIN
            INSERT INTO meta (key, value) VALUES ('vectors_rewritten:' || NEW.kind || ':' || NEW.user_id, '1')
            ON CONFLICT (key) DO UPDATE SET value = CAST(value AS INTEGER) + 1;
            INSERT INTO meta (key, value)
            SELECT 'vectors_rewritten:' || OLD.kind || ':' || OLD.user_id, '1'
            WHERE OLD.kind IS NOT NEW.kind OR OLD.user_id IS NOT NEW.user_id
            ON CONFLICT (key) DO UPDATE SET value = CAST(value AS INTEGER) + 1;
        END;
        """,
    ),
    (
        5,
        "tokens kept beside an exchange's text",
        # ``text.token_record`` of the two texts, written with them: recall's coverage and
        # feedback steps read a few dozen exchanges' words per query, and tokenising them was
        # ~1 ms of a recall's own work at 10k exchanges. Rows written before stay NULL and are
        # tokenised when read, as before.
        """
        ALTER TABLE exchanges ADD COLUMN tokens TEXT;
        """,
    ),
    (
        6,
        "count vector deletions and inserts below a partition's highest rowid as rewrites",
        # With these in migration 4's count, any change to a partition other than rows appended
        # after its highest rowid moves the count, so a vector snapshot is trusted without
        # counting the partition's rows: that count(*) read ~30 MB of index at 1M rows, 0.6 s
        # of a cold first recall (BENCHMARKS.md, "An 8-bit first pass"). Snapshots saved before
        # this migration are still counted (their "format" is below 2).
        """
        CREATE TRIGGER vectors_deleted AFTER DELETE ON vectors
        BEGIN
            INSERT INTO meta (key, value) VALUES ('vectors_rewritten:' || OLD.kind || ':' || OLD.user_id, '1')
            ON CONFLICT (key) DO UPDATE SET value = CAST(value AS INTEGER) + 1;
        END;
        CREATE TRIGGER vectors_inserted_below AFTER INSERT ON vectors
        WHEN EXISTS (SELECT 1 FROM vectors WHERE user_id = NEW.user_id AND kind = NEW.kind AND rid > NEW.rid)
        BEGIN
            INSERT INTO meta (key, value) VALUES ('vectors_rewritten:' || NEW.kind || ':' || NEW.user_id, '1')
            ON CONFLICT (key) DO UPDATE SET value = CAST(value AS INTEGER) + 1;
        END;
        """,
    ),
]
