"""``arbormem consolidate`` and ``arbormem bench-consolidate`` (registered by ``cli.py``)."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from ..errors import ArbormemError, ValidationError


def _fail(exc: ArbormemError) -> None:
    click.echo(f"error: {exc}", err=True)
    raise SystemExit(2 if isinstance(exc, ValidationError) else 1)


def tree_summary(mem: Any, user_id: str) -> dict[str, Any]:
    """Counts that show what consolidation changed: topics, themes, depth, archived."""
    root = mem.tree(user_id=user_id)
    nodes = root.walk()
    exs = mem.store.list_exchanges(user_id, status="completed")
    return {
        "topics": sum(1 for t in nodes if t.kind == "topic"),
        "themes": sum(1 for t in nodes if t.kind == "theme"),
        "depth": root.height() - 1,
        "exchanges": len(exs),
        "archived": sum(1 for e in exs if e.archived),
        "largest_topic": max((t.size for t in nodes if t.kind == "topic"), default=0),
    }


def _line(name: str, s: dict[str, Any]) -> str:
    return (f"{name:7} {s['topics']} topics, {s['themes']} themes, depth {s['depth']}, "
            f"{s['exchanges']} exchanges ({s['archived']} archived), largest topic {s['largest_topic']}")


@click.command("consolidate", help="Merge related frozen topics, link, archive trivia, dedup and mark "
               "superseded facts (logged, undoable); shows the tree before and after.")
@click.option("--db", default=None, envvar="ARBORMEM_DB", help="SQLite memory file (default: arbormem.db).")
@click.option("--user", "user_id", default=None, help="One user (default: every user).")
@click.option("--embedder", default=None, help="'local' (bundled MiniLM), 'hash', or a model folder.")
@click.option("--show-tree", is_flag=True, help="Print the whole tree before and after.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def consolidate_command(db: str | None, user_id: str | None, embedder: str | None, show_tree: bool,
                        as_json: bool) -> None:
    from ..cli import print_tree
    from ..memory import Memory

    try:
        with Memory(db, embedder=embedder) as mem:
            users = [user_id] if user_id else mem.store.list_users()
            out = []
            for uid in users:
                before = tree_summary(mem, uid)
                if show_tree and not as_json:
                    click.secho(f"[{uid}] before:", bold=True)
                    print_tree(mem.tree(user_id=uid))
                report = mem.consolidate(uid)
                after = tree_summary(mem, uid)
                out.append({"user_id": uid, "before": before, "after": after, "report": report.to_dict()})
                if as_json:
                    continue
                if show_tree:
                    click.secho(f"[{uid}] after:", bold=True)
                    print_tree(mem.tree(user_id=uid))
                click.secho(f"[{uid}]", bold=True)
                click.echo(_line("before:", before))
                click.echo(_line("after:", after))
                click.echo(f"merged {report.merged}, linked {report.linked}, archived {report.archived}, "
                           f"deduplicated {report.deduplicated}, superseded {report.superseded}, "
                           f"tagged {report.tagged}, short topics moved home {report.rehomed}, "
                           f"vetoed {report.vetoed}, skipped {report.skipped}, "
                           f"LLM calls {report.llm_calls}, {report.duration:.2f}s "
                           f"(undo any change: Memory.undo(change_id); Memory.history(id))")
            if as_json:
                click.echo(json.dumps(out, indent=2, ensure_ascii=False, default=str))
    except ArbormemError as exc:
        _fail(exc)


@click.command("bench-consolidate", help="Build a synthetic N-exchange memory and time consolidation "
               "(default embedder: the deterministic 'hash' one, for speed; pass --embedder local for MiniLM).")
@click.option("--size", default=10_000, show_default=True, help="Exchanges to ingest.")
@click.option("--embedder", default="hash", show_default=True, help="'hash', 'local' or a model folder.")
@click.option("--db", default=None, help="SQLite file to build (default: a temporary file).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def bench_consolidate_command(size: int, embedder: str, db: str | None, as_json: bool) -> None:
    from ..eval.bench import synthetic_items
    from ..eval.runner import code_version, machine_description
    from ..memory import Memory

    if size < 1:
        _fail(ValidationError("--size must be at least 1"))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(db) if db else Path(tmp) / "bench.db"
        items, _ = synthetic_items(size)
        try:
            with Memory(path, embedder=embedder) as mem:
                uid = "bench"
                t0 = time.perf_counter()
                mem.add_many(items, user_id=uid)
                ingest = time.perf_counter() - t0
                before = tree_summary(mem, uid)
                first = mem.consolidate(uid)
                after = tree_summary(mem, uid)
                second = mem.consolidate(uid)
                mem.add_many(items[:50], user_id=uid)  # a few new exchanges, then the idle run
                third = mem.consolidate(uid)
        except ArbormemError as exc:
            _fail(exc)
    result = {
        "size": size, "embedder": embedder, "ingest_seconds": round(ingest, 2),
        "consolidate_seconds": round(first.duration, 2), "second_run_seconds": round(second.duration, 2),
        "after_50_new_seconds": round(third.duration, 2), "before": before, "after": after,
        "first_run": first.to_dict() | {"changes": len(first.changes)},
        "machine": machine_description(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "version": code_version(),
    }
    if as_json:
        click.echo(json.dumps(result, indent=2, default=str))
        return
    click.echo(f"{size} exchanges ({embedder} embedder) ingested in {ingest:.1f}s")
    click.echo(_line("before:", before))
    click.echo(_line("after:", after))
    click.echo(f"consolidate: {first.duration:.2f}s (merged {first.merged}, linked {first.linked}, "
               f"archived {first.archived}, deduplicated {first.deduplicated}, superseded {first.superseded}, "
               f"tagged {first.tagged}); second run {second.duration:.2f}s; "
               f"after 50 new exchanges {third.duration:.2f}s")
    click.echo(f"{result['machine']}; {result['date']}; {result['version']}")


__all__ = ["consolidate_command", "bench_consolidate_command", "tree_summary"]
