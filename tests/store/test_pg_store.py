"""PostgreSQL-only behaviour of PostgresStore: connection, migrations, per-dimension indexes."""

from __future__ import annotations

import socket
import threading

import numpy as np
import psycopg
import pytest

from arbormem.errors import MigrationError, StoreError, ValidationError
from arbormem.store.pg_migrations import PG_MIGRATIONS
from arbormem.store.postgres import PostgresStore, _redact

from .test_contract import ex, topic, unit


def test_rejects_other_urls_and_bad_pool_sizes() -> None:
    with pytest.raises(ValidationError):
        PostgresStore("sqlite:///x.db")
    with pytest.raises(ValidationError):
        PostgresStore("postgresql://localhost/db", min_size=3, max_size=2)


def test_unreachable_server_is_a_store_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once the socket closes
    with pytest.raises(StoreError, match="cannot connect"):
        PostgresStore(f"postgresql://postgres:secret@127.0.0.1:{port}/db", timeout=2)


def test_password_never_shown() -> None:
    assert _redact("postgresql://app:s3cr3t@db:5432/mem") == "postgresql://app:***@db:5432/mem"
    assert _redact("postgresql://app@db/mem") == "postgresql://app@db/mem"


def test_concurrent_first_opens_migrate_once(pg_database: str) -> None:
    stores: list[PostgresStore] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            stores.append(PostgresStore(pg_database, max_size=1))
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == [] and len(stores) == 4
        with psycopg.connect(pg_database) as conn:
            assert conn.execute("SELECT count(*) FROM arbormem_schema_migrations").fetchone()[0] == len(PG_MIGRATIONS)
        assert "s3cr3t" not in repr(stores[0]) and "PostgresStore(" in repr(stores[0])
    finally:
        for s in stores:
            s.close()


def test_version_2_restems_a_version_1_text_index(pg_database: str) -> None:
    store = PostgresStore(pg_database)
    store.insert_exchange(ex("u", 1, "Researching adoption agencies"))
    store.put_text("u", "exchange", "e_u_1", "Researching adoption agencies")
    store.close()
    # Put the database back to schema version 1: unstemmed tokens, migration 2 not applied.
    with psycopg.connect(pg_database) as conn:
        conn.execute("UPDATE arbormem_text SET tsv = 'researching:1 adoption:2 agencies:3'::tsvector")
        conn.execute("DELETE FROM arbormem_schema_migrations WHERE version = 2")
    store = PostgresStore(pg_database)
    try:
        assert [h[0] for h in store.text_search("u", "exchange", ["research"], 5)] == ["e_u_1"]
        with psycopg.connect(pg_database) as conn:
            tsv = conn.execute("SELECT tsv::text FROM arbormem_text").fetchone()[0]
        assert tsv == "'adopt':2 'agenc':3 'research':1"
    finally:
        store.close()


def test_newer_schema_is_refused(pg_database: str) -> None:
    PostgresStore(pg_database).close()
    with psycopg.connect(pg_database) as conn:
        conn.execute("INSERT INTO arbormem_schema_migrations (version, name) VALUES (999, 'future')")
    with pytest.raises(MigrationError, match="upgrade arbormem"):
        PostgresStore(pg_database)


def test_closed_store_raises(pg_database: str) -> None:
    store = PostgresStore(pg_database)
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        store.get_meta("x")


def test_one_hnsw_index_per_dimension(pg_database: str) -> None:
    store = PostgresStore(pg_database)
    try:
        store.put_vectors("u", "exchange", ["a", "b"], np.stack([unit(1, 0, 0, 0), unit(0, 1, 0, 0)]))
        store.put_vectors("u", "exchange", ["c"], np.stack([unit(*range(1, 9))]))
        assert store.get_meta("pg_vector_dims") == "4,8"
        assert [i for i, _ in store.vector_search("u", "exchange", unit(0, 1, 0, 0), 5)] == ["b", "a"]
        assert [i for i, _ in store.vector_search("u", "exchange", unit(*range(1, 9)), 5)] == ["c"]
        with psycopg.connect(pg_database) as conn:
            names = {r[0] for r in conn.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'arbormem_vectors'")}
        assert {"arbormem_vectors_hnsw_4", "arbormem_vectors_hnsw_8"} <= names
        with pytest.raises(ValidationError):
            store.put_vectors("u", "exchange", ["x"], np.array([[np.nan, 1.0]], dtype=np.float32))
        with pytest.raises(ValidationError):
            store.put_vectors("u", "exchange", ["x", "y"], np.ones((1, 4), dtype=np.float32))
    finally:
        store.close()


def test_one_user_cannot_overwrite_another_users_rows(pg_database: str) -> None:
    store = PostgresStore(pg_database)
    try:
        store.put_topic(topic("alice", "t1", None, title="mine"))
        store.put_topic(topic("mallory", "t1", None, title="stolen"))
        got = store.get_topic("t1")
        assert got is not None and (got.user_id, got.title) == ("alice", "mine")
        store.put_vectors("alice", "topic", ["t1"], np.stack([unit(1, 0)]))
        store.put_vectors("mallory", "topic", ["t1"], np.stack([unit(0, 1)]))
        assert np.allclose(store.get_vectors("alice", "topic", ["t1"])["t1"], unit(1, 0))
        store.insert_exchange(ex("alice", 1, "private"))
        with pytest.raises(StoreError):
            store.put_text("mallory", "exchange", "e_alice_1", "overwritten")
        forged = ex("mallory", 1, "forged", ex_id="e_alice_1")
        store.update_exchange(forged)
        kept = store.get_exchange("e_alice_1")
        assert kept is not None and kept.user_text == "private"
    finally:
        store.close()


def test_concurrent_first_vectors_create_the_index_once(pg_database: str) -> None:
    stores = [PostgresStore(pg_database, max_size=1) for _ in range(6)]
    barrier = threading.Barrier(len(stores))
    errors: list[BaseException] = []

    def first_write(i: int, s: PostgresStore) -> None:
        try:
            barrier.wait()
            with s.transaction(f"user{i}"):
                s.put_vectors(f"user{i}", "exchange", [f"x{i}"], np.stack([unit(1, i + 1, 3)]))
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    threads = [threading.Thread(target=first_write, args=(i, s)) for i, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        assert stores[0].get_meta("pg_vector_dims") == "3"
        for i in range(len(stores)):
            assert [h[0] for h in stores[0].vector_search(f"user{i}", "exchange", unit(1, i + 1, 3), 3)] == [f"x{i}"]
    finally:
        for s in stores:
            s.close()
