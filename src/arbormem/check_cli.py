"""Click command ``arbormem check`` (registered by ``arbormem.cli``; import-light)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .errors import ArbormemError, ValidationError


@click.command("check")
@click.option("--db", "db", required=True, type=click.Path(dir_okay=False),
              help="The SQLite memory file to check.")
@click.option("--user", "user_id", default=None, help="Check only this user (default: every user).")
@click.option("--repair", is_flag=True,
              help="Rebuild tree, vectors, full-text entries and term statistics of users with "
                   "problems from their transcript (one transaction per user).")
@click.option("--embedder", default=None,
              help="Embedder for vectors a repair must recompute (default: the one recorded in "
                   "the memory when arbormem can rebuild it, e.g. hash:256).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def check_command(db: str, user_id: str | None, repair: bool, embedder: str | None,
                  as_json: bool) -> None:
    """Verify that the derived data of a memory agrees with its transcript.

    Exits 0 when everything agrees (or was repaired), 1 when problems remain, 2 on bad input.
    """
    from .check import check, embedder_spec, report_json
    from .memory import Memory
    from .store.sqlite import SQLiteStore

    memory = None
    try:
        if not Path(db).exists():
            raise ValidationError(f"no SQLite memory at {db}")
        store = SQLiteStore(db)
        # Checking needs no embedder; a repair re-embeds only vectors that are missing. A
        # placeholder is enough until then: Memory refuses to mix it with the recorded model.
        spec = embedder or embedder_spec(store.get_meta("embedder")) or "hash"
        memory = Memory(store=store, embedder=spec)
        report = check(memory, user_id=user_id, repair=repair)
    except ArbormemError as exc:
        hint = "" if embedder else " (pass --embedder)" if "embedder" in str(exc) else ""
        click.echo(f"error: {exc}{hint}", err=True)
        sys.exit(2 if isinstance(exc, ValidationError) else 1)
    finally:
        if memory is not None:
            memory.close()
    if as_json:
        click.echo(report_json(report))
    else:
        if report.integrity != "ok":
            click.echo(f"SQLite integrity_check: {report.integrity}", err=True)
        for u in report.users:
            state = "repaired" if u.repaired else ("ok" if u.ok else "PROBLEMS")
            queued = f" ({u.queued} queued for placement)" if u.queued else ""
            click.echo(f"{u.user_id}: {u.completed}/{u.exchanges} completed{queued}, {u.topics} topics: {state}")
            for p in u.problems:
                click.echo(f"  {p}", err=True)
        click.echo("ok" if report.ok else "check FAILED")
    if not report.ok:
        sys.exit(1)
