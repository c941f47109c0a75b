"""Click command ``arbormem migrate-store`` (registered by ``arbormem.cli``).

Kept import-light: stores and drivers are imported when the command runs, not when the CLI
loads.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..errors import ArbormemError, ValidationError
from .base import Store


def open_store(location: str, *, create: bool) -> Store:
    """A store from a location: ``postgresql://...``, ``sqlite:///path.db`` or a file path.

    ``sqlite:///memory.db`` is relative to the working directory, ``sqlite:////abs/path.db``
    absolute (SQLAlchemy's convention).
    """
    if location.startswith(("postgresql://", "postgres://")):
        from .postgres import PostgresStore

        return PostgresStore(location)
    path = location
    if location.startswith("sqlite:"):
        if not location.startswith("sqlite:///"):
            raise ValidationError(f"bad SQLite URL {location!r}: use sqlite:///relative.db or sqlite:////abs.db")
        path = location[len("sqlite:///"):]
    elif "://" in location:
        raise ValidationError(f"unknown store URL scheme in {location!r}: use sqlite:/// or postgresql://")
    if not path or path == ":memory:":
        raise ValidationError("migrate-store needs a SQLite file, not an in-memory database")
    if not create and not Path(path).exists():
        raise ValidationError(f"no SQLite memory at {path}")
    from .sqlite import SQLiteStore

    return SQLiteStore(path)


@click.command("migrate-store")
@click.option("--from", "source", required=True, metavar="URL",
              help="Source memory: sqlite:///path.db (or a file path) or postgresql://...")
@click.option("--to", "target", required=True, metavar="URL",
              help="Destination (must not hold the copied users yet); same forms as --from.")
@click.option("--user", "users", multiple=True, help="Copy only this user (repeatable); default all.")
@click.option("--batch", default=500, show_default=True, type=click.IntRange(1, 100_000),
              help="Rows per destination transaction.")
@click.option("--json", "as_json", is_flag=True, help="Print the verification report as JSON.")
@click.option("--quiet", is_flag=True, help="No progress lines on stderr.")
def migrate_store(source: str, target: str, users: tuple[str, ...], batch: int, as_json: bool,
                  quiet: bool) -> None:
    """Copy a memory between SQLite and PostgreSQL, losslessly, and verify the copy.

    Every exchange, topic, vector, text-index entry, term statistic, change-log row and
    sequence counter is copied, then both sides are compared by counts and SHA-256 checksums.
    Exits 1 when anything differs.
    """
    from .migrate import copy_store

    def progress(stage: str, done: int, total: int) -> None:
        if not quiet:
            click.echo(f"{stage}: {done}/{total}", err=True)

    src = dst = None
    try:
        src = open_store(source, create=False)
        dst = open_store(target, create=True)
        report = copy_store(src, dst, users=list(users) or None, batch=batch, progress=progress)
    except ArbormemError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2 if isinstance(exc, ValidationError) else 1)
    finally:
        for s in (src, dst):
            if s is not None:
                s.close()
    if as_json:
        click.echo(json.dumps({**report.to_dict(), "ok": report.ok, "totals": report.totals},
                              indent=2, ensure_ascii=False))
    else:
        totals = ", ".join(f"{v} {k}" for k, v in report.totals.items())
        click.echo(f"copied {len(report.users)} user(s) in {report.seconds:.1f}s: {totals}")
        for line in report.mismatches:
            click.echo(f"MISMATCH {line}", err=True)
        click.echo("verified: counts and checksums match" if report.ok else "verification FAILED")
    if not report.ok:
        sys.exit(1)
