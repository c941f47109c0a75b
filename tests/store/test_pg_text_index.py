"""PostgreSQL lexical index: no GIN pending list (schema version 3), statistics kept fresh."""

from __future__ import annotations

import psycopg
import pytest

import arbormem.store.postgres as pg
from arbormem.store.postgres import PostgresStore

from .test_contract import ex


def _pending_pages(conn: psycopg.Connection, index: str = "arbormem_text_tsv_exchange") -> int:
    return int(conn.execute("SELECT pending_pages FROM pgstatginindex(%s::regclass)", (index,)).fetchone()[0])


def _write(store: PostgresStore, seqs: range) -> None:
    for i in seqs:
        body = f"garden note {i} about tomato seedlings and basil"
        store.insert_exchange(ex("u", i, body))
        store.put_text("u", "exchange", f"e_u_{i}", body)


def test_versions_3_and_5_leave_no_gin_pending_list(pg_database: str) -> None:
    store = PostgresStore(pg_database)
    # The GIN index as schema version 2 had it (migration 1 made it with fastupdate on), one
    # over both kinds (version 5 makes one per kind).
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        conn.execute("DROP INDEX arbormem_text_tsv_exchange, arbormem_text_tsv_topic")
        conn.execute("DROP TABLE arbormem_text_df")
        conn.execute("CREATE INDEX arbormem_text_tsv ON arbormem_text USING gin (tsv) WITH (fastupdate = on)")
        conn.execute("DELETE FROM arbormem_schema_migrations WHERE version = 5")
    _write(store, range(1, 21))
    store.close()
    with psycopg.connect(pg_database) as conn:
        assert _pending_pages(conn, "arbormem_text_tsv") > 0  # what every search had to read through
        conn.execute("DELETE FROM arbormem_schema_migrations WHERE version = 3")

    store = PostgresStore(pg_database)  # applies versions 3 and 5
    try:
        with psycopg.connect(pg_database) as conn:
            assert conn.execute("SELECT to_regclass('arbormem_text_tsv')").fetchone()[0] is None
            for kind in ("exchange", "topic"):
                index = f"arbormem_text_tsv_{kind}"
                assert _pending_pages(conn, index) == 0
                opts = conn.execute("SELECT reloptions FROM pg_class WHERE relname = %s", (index,)).fetchone()[0]
                assert "fastupdate=off" in opts
        _write(store, range(21, 41))  # new entries go straight into the index
        with psycopg.connect(pg_database) as conn:
            assert _pending_pages(conn) == 0
        hits = store.text_search("u", "exchange", ["note 33"], 3)
        assert hits[0][0] == "e_u_33"
    finally:
        store.close()


def test_put_text_analyzes_when_a_partition_doubles(pg_database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Without statistics the planner expects a handful of rows for a user's partition and
    # tests every one against each query term instead of using the GIN index.
    monkeypatch.setattr(pg, "_ANALYZE_FROM", 8)
    store = PostgresStore(pg_database)

    def analyzed_rows() -> float:
        with psycopg.connect(pg_database) as conn:
            return float(conn.execute("SELECT reltuples FROM pg_class WHERE relname = 'arbormem_text'").fetchone()[0])

    try:
        _write(store, range(1, 8))
        assert analyzed_rows() < 0  # never analyzed yet
        _write(store, range(8, 9))
        assert analyzed_rows() == 8
        store.put_text("u", "exchange", "e_u_8", "a new text for an indexed exchange")  # not a new document
        _write(store, range(9, 16))
        assert analyzed_rows() == 8
        with store.transaction("u"):  # inside a writer's transaction too, counting its own rows
            _write(store, range(16, 17))
        assert analyzed_rows() == 16
    finally:
        store.close()
