"""The ``arbormem`` command line: a thin layer over the library.

Every command takes ``--db`` (SQLite file; ``ARBORMEM_DB``) and most take ``--user``;
``--json`` prints machine-readable output. Errors print one line to stderr and exit non-zero
(2 for bad input, 1 otherwise).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from functools import wraps
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import click

from .errors import ArbormemError, ImportFormatError, NotFoundError, ValidationError

F = TypeVar("F", bound=Callable[..., Any])


def cli_errors(fn: F) -> F:
    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ArbormemError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2 if isinstance(exc, ValidationError) else 1)

    return wrapper  # type: ignore[return-value]


db_option = click.option("--db", default=None, envvar="ARBORMEM_DB", help="SQLite memory file (default: arbormem.db).")
user_option = click.option("--user", "user_id", default="default", show_default=True, help="User id (a hard partition).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")
embedder_option = click.option("--embedder", default=None, help="'local' (bundled MiniLM), 'hash', or a model folder.")


def _role_timeouts(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in values:
        role, sep, seconds = item.partition("=")
        try:
            value = float(seconds)
        except ValueError:
            value = float("nan")
        if not sep or not role.strip() or not value > 0:
            raise click.BadParameter(f"expected ROLE=SECONDS with SECONDS > 0, got {item!r}")
        out[role.strip()] = value
    return out


def llm_options(*, budget_default: float | None = None) -> Callable[[F], F]:
    """``--llm-deadline``, ``--llm-timeout ROLE=SECONDS`` and ``--llm-budget``; the command
    gets ``settings`` (environment + these) instead of the three values."""

    def decorate(fn: F) -> F:
        @wraps(fn)
        def wrapper(*args: Any, llm_deadline: float | None, llm_timeout: dict[str, float],
                    llm_budget: float | None, **kwargs: Any) -> Any:
            from .config import LLMSettings, Settings

            base = Settings()
            llm: dict[str, Any] = {}
            if llm_deadline is not None:
                llm["recall_deadline"] = llm_deadline
            if llm_timeout:
                llm["timeouts"] = {**base.llm.timeouts, **llm_timeout}  # over ARBORMEM_LLM__TIMEOUTS
            if llm_budget is not None:
                llm["organize_budget"] = llm_budget
            if llm:  # options > environment > defaults, validated like the rest
                base = base.model_copy(update={"llm": LLMSettings.model_validate({**base.llm.model_dump(), **llm})})
            return fn(*args, settings=base, **kwargs)

        options = [
            click.option("--llm-deadline", type=click.FloatRange(min=0, min_open=True), default=None,
                         help="Seconds the LLM step of a recall may take in all "
                              "(default: ARBORMEM_LLM__RECALL_DEADLINE or 1.2)."),
            click.option("--llm-timeout", multiple=True, callback=_role_timeouts, metavar="ROLE=SECONDS",
                         help="Timeout of one call of a role (labeler, segmenter, router, veto, detail, "
                              "planner); repeatable (default: ARBORMEM_LLM__TIMEOUTS, else "
                              "ARBORMEM_LLM__TIMEOUT)."),
            click.option("--llm-budget", type=click.FloatRange(min=0, min_open=True), default=budget_default,
                         show_default=budget_default is not None,
                         help="Seconds the LLM calls of one organize run may take in all "
                              "(default: ARBORMEM_LLM__ORGANIZE_BUDGET or 120)."),
        ]
        out: Any = wrapper
        for option in reversed(options):
            out = option(out)
        return out  # type: ignore[no-any-return]

    return decorate


def _memory(db: str | None, embedder: str | None = None, **kwargs: Any) -> Any:
    from .memory import Memory

    return Memory(db, embedder=embedder, **kwargs)


def _existing(db: str | None, embedder: str | None = None, *, user_id: str | None = None,
              settings: Any = None) -> Any:
    """A memory that must exist already, for the commands that only read (or delete): a
    missing file, a directory, a file that is not an arbormem memory and (with ``user_id``)
    a user the memory does not hold are one-line errors, and nothing is created."""
    from .config import Settings
    from .memory import Memory
    from .store.sqlite import SQLiteStore
    from .validate import user_id as check_user

    settings = settings if settings is not None else Settings()
    if user_id is not None:
        check_user(user_id)
    if db is None and settings.database_url:
        mem = Memory(embedder=embedder, settings=settings)  # PostgreSQL: it exists or fails
        where = "the PostgreSQL memory"
    else:
        path = db if db is not None else settings.db
        if path != ":memory:" and not Path(path).exists():
            raise ValidationError(f"no SQLite memory at {path}")
        mem = Memory(store=SQLiteStore(path, create=path == ":memory:"), embedder=embedder, settings=settings)
        where = str(path)
    if user_id is not None:
        users = mem.store.list_users()
        if user_id not in users:
            mem.close()
            shown = ", ".join(repr(u) for u in users[:5]) + (", ..." if len(users) > 5 else "")
            raise NotFoundError(f"no user {user_id!r} in {where} "
                                f"({len(users)} user{'s' if len(users) != 1 else ''}{': ' + shown if users else ''})")
    return mem


def _print_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, ensure_ascii=False, default=str))


def print_tree(root: Any, *, max_depth: int = 99) -> None:
    def walk(node: Any, prefix: str, last: bool, depth: int) -> None:
        if node.kind != "root":
            branch = "└─ " if last else "├─ "
            span = f"#{node.start_seq}-{node.end_seq}" if node.start_seq is not None else ""
            mark = "" if node.frozen else " (open)"
            label = click.style(node.title, bold=node.kind == "theme")
            click.echo(f"{prefix}{branch}{label}  [{node.size} ex {span}]{mark}")
            prefix += "   " if last else "│  "
        if depth >= max_depth:
            return
        for i, child in enumerate(node.children):
            walk(child, prefix, i == len(node.children) - 1, depth + 1)

    walk(root, "", True, 0)


@click.group(help="arbormem: long-term memory for LLM apps, organised as a tree of topics.")
@click.version_option(package_name="arbormem")
def main() -> None:
    pass


@main.command(help="Ingest a sample multi-topic conversation, show the tree and a budgeted recall (offline).")
@click.option("--db", default=":memory:", show_default=True, help="Where to build the demo memory.")
@embedder_option
@click.option("--max-tokens", default=400, show_default=True, help="Recall budget.")
@click.option("--question", default=None, help="Ask your own question instead of the sample one.")
@click.option("--llm-base-url", default=None, envvar="ARBORMEM_LLM__BASE_URL", help="OpenAI-compatible endpoint (optional).")
@click.option("--llm-model", default=None, envvar="ARBORMEM_LLM__MODEL", help="Model name at that endpoint.")
@llm_options(budget_default=6.0)
@json_option
@cli_errors
def demo(db: str, embedder: str | None, max_tokens: int, question: str | None,
         llm_base_url: str | None, llm_model: str | None, as_json: bool, settings: Any) -> None:
    data = json.loads(resources.files("arbormem").joinpath("data/demo.json").read_text("utf-8"))
    user = data["user_id"]
    question = question or data["question"]
    llm = None
    if llm_base_url and llm_model:
        llm = make_llm(llm_base_url, llm_model, settings.llm)
    t0 = time.perf_counter()
    organized = None
    with _memory(db, embedder, llm=llm, settings=settings) as mem:
        if mem.store.count_exchanges(user)["completed"] == 0:
            mem.add_many(data["exchanges"], user_id=user)
        t_ingest = time.perf_counter() - t0
        if llm is not None:
            organized = mem.organize(user)
        root = mem.tree(user_id=user)
        t1 = time.perf_counter()
        r = mem.recall(question, user_id=user, max_tokens=max_tokens)
        t_recall = time.perf_counter() - t1
        full = mem.tokens.count("\n".join(e.text for e in mem.exchanges(user_id=user)))
        if as_json:
            out = {"tree": root.to_dict(), "question": question, "recall": r.to_dict(),
                   "full_transcript_tokens": full}
            if llm is not None:
                out["llm"] = llm.usage().to_dict()
                out["organize"] = organized.to_dict() if organized is not None else None
            _print_json(out)
            return
        click.secho(f"Ingested {root.size} exchanges in {t_ingest:.2f}s. Topic tree:", bold=True)
        print_tree(root)
        click.secho(f"\nQuestion: {question}", bold=True)
        paths = sorted({" › ".join(t.path) for t in r.topics})
        click.echo("Branches used: " + ("; ".join(paths) or "(none)"))
        click.secho(f"\nMemory context ({r.tokens} tokens, budget {max_tokens}, {t_recall * 1000:.0f} ms):", bold=True)
        click.echo(r.text)
        click.secho(f"\nCost: {r.tokens} tokens vs {full} for the full transcript "
                    f"({100 * r.tokens / max(full, 1):.0f}%).", bold=True)
        if llm is not None:
            if organized is not None:
                click.echo(f"Organize: labelled {organized.labelled}/{organized.candidates} topics"
                           + (f", stopped: {organized.stop_reason}" if organized.stop_reason else ""))
            click.echo(f"LLM: {llm.usage().summary()}")


def make_llm(base_url: str, model: str, s: Any = None) -> Any:
    """A runner for the endpoint with the LLM settings ``s`` (default: the environment's)."""
    from .config import Settings
    from .llm import LLMRunner
    from .llm.openai import OpenAICompatibleLLM
    from .llm.runner import breaker_options

    s = s if s is not None else Settings().llm
    key = s.api_key.get_secret_value() if s.api_key is not None else None
    return LLMRunner(OpenAICompatibleLLM(base_url, model, api_key=key, timeout=s.timeout,
                                         max_retries=s.max_retries, concurrency=s.concurrency),
                     **breaker_options(s))


@main.command(help="Label and summarise frozen topics through the configured LLM.")
@db_option
@user_option
@embedder_option
@click.option("--limit", default=50, show_default=True, help="At most this many topics.")
@llm_options()
@json_option
@cli_errors
def organize(db: str | None, user_id: str, embedder: str | None, limit: int, as_json: bool, settings: Any) -> None:
    with _existing(db, embedder, user_id=user_id, settings=settings) as mem:
        if mem.llm is None:
            raise click.ClickException("no LLM: set ARBORMEM_LLM__BASE_URL and ARBORMEM_LLM__MODEL")
        r = mem.organize(user_id, limit=limit)
        fails = [c.to_dict() for c in mem.llm_log(failures_only=True)]
        usage = mem.llm.usage()
    if as_json:
        _print_json({**r.to_dict(), "llm": usage.to_dict(), "failures": fails})
    else:
        click.echo(f"labelled {r.labelled}/{r.candidates} topics ({r.failed} failed, {r.skipped} skipped)"
                   + (f"; stopped: {r.stop_reason}" if r.stop_reason else ""))
        click.echo(f"LLM: {usage.summary()}")


@main.command("import", help="Import exchanges from a JSON list or JSONL file (one exchange per line). "
                             "Items the memory already holds (same messages, session and times) are "
                             "skipped and counted, so importing a file twice stores it once.")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@db_option
@user_option
@embedder_option
@json_option
@cli_errors
def import_cmd(path: Path, db: str | None, user_id: str, embedder: str | None, as_json: bool) -> None:
    items = read_import_file(path)
    from tqdm import tqdm

    with _memory(db, embedder) as mem, tqdm(total=len(items), unit="ex", disable=as_json, file=sys.stderr) as bar:
        rep = mem.import_exchanges(items, user_id=user_id, progress=lambda n, total: bar.update(n - bar.n))
    if as_json:
        _print_json({"imported": len(rep.added), "skipped": len(rep.skipped), "user_id": user_id,
                     "skipped_items": [s.to_dict() for s in rep.skipped]})
    else:
        click.echo(f"imported {len(rep.added)} exchanges for user {user_id!r}"
                   + (f"; skipped {len(rep.skipped)} already in the memory (items "
                      f"{', '.join(str(s.index + 1) for s in rep.skipped[:10])}"
                      f"{', ...' if len(rep.skipped) > 10 else ''})" if rep.skipped else ""))


def read_import_file(path: Path) -> list[dict[str, Any]]:
    """Items of a .json (list, or {"exchanges": [...]}) or .jsonl file; errors carry the line."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ImportFormatError("not valid UTF-8", line=line) from exc
    if path.suffix == ".jsonl":
        items = []
        # Lines end at "\n" only: str.splitlines() also breaks at form feeds, U+2028 and other
        # separators that JSON allows raw inside strings, which split valid lines in two and
        # shifted every reported line number.
        for n, line_text in enumerate(text.split("\n"), 1):
            if not line_text.strip():
                continue
            try:
                item = json.loads(line_text)
            except json.JSONDecodeError as exc:
                raise ImportFormatError(f"invalid JSON: {exc.msg}", line=n) from exc
            if not isinstance(item, dict):
                raise ImportFormatError("each line must be a JSON object", line=n)
            items.append(item)
        return items
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ImportFormatError(f"invalid JSON: {exc.msg}", line=exc.lineno) from exc
    if isinstance(data, dict) and isinstance(data.get("exchanges"), list):
        data = data["exchanges"]
    if not isinstance(data, list):
        raise ImportFormatError("expected a list of exchanges or {'exchanges': [...]}")
    return data


def filter_options(f: Any) -> Any:
    """``--session``, ``--since``, ``--until``, ``--meta KEY=VALUE`` and ``--min-relevance`` of
    recall and search (issue 18); they arrive as one ``filters`` dict of Memory arguments."""
    opts = [
        click.option("--min-relevance", type=float, default=None,
                     help="Relevance floor (default: the embedder's calibrated one); 0 fills the budget."),
        click.option("--meta", multiple=True, metavar="KEY=VALUE",
                     help="Only exchanges whose metadata KEY equals VALUE (JSON scalar, else text); repeatable."),
        click.option("--until", default=None, help="Only exchanges before this ISO 8601 time."),
        click.option("--since", default=None, help="Only exchanges at or after this ISO 8601 time."),
        click.option("--session", "session_id", default=None, help="Only exchanges of this session id."),
    ]
    for opt in opts:
        f = opt(f)
    return f


def _filters(session_id: str | None, since: str | None, until: str | None, meta: tuple[str, ...],
             min_relevance: float | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for item in meta:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--meta")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        metadata[key] = raw if isinstance(value, (dict, list)) else value
    return {"session_id": session_id, "since": since, "until": until, "metadata": metadata or None,
            "min_relevance": min_relevance}


@main.command(help="Print the memory context recall would inject for a message.")
@click.argument("query")
@db_option
@user_option
@embedder_option
@click.option("--max-tokens", type=int, default=None,
              help="Recall budget (default: the ARBORMEM_RECALL__MAX_TOKENS setting, 1024).")
@filter_options
@llm_options()
@json_option
@cli_errors
def recall(query: str, db: str | None, user_id: str, embedder: str | None, max_tokens: int | None, as_json: bool,
           session_id: str | None, since: str | None, until: str | None, meta: tuple[str, ...],
           min_relevance: float | None, settings: Any) -> None:
    filters = _filters(session_id, since, until, meta, min_relevance)
    with _existing(db, embedder, user_id=user_id, settings=settings) as mem:
        r = mem.recall(query, user_id=user_id, max_tokens=max_tokens, **filters)
    if as_json:
        _print_json(r.to_dict())
    else:
        click.echo(r.text or "(no memory)")
        click.echo(f"-- {r.tokens} tokens, {len(r.exchanges)} exchanges, {len(r.topics)} topics; "
                   f"{r.trace.stopped}", err=True)


@main.command(help="Ranked exchanges matching a query.")
@click.argument("query")
@db_option
@user_option
@embedder_option
@click.option("--limit", default=10, show_default=True)
@filter_options
@json_option
@cli_errors
def search(query: str, db: str | None, user_id: str, embedder: str | None, limit: int, as_json: bool,
           session_id: str | None, since: str | None, until: str | None, meta: tuple[str, ...],
           min_relevance: float | None) -> None:
    filters = _filters(session_id, since, until, meta, min_relevance)
    with _existing(db, embedder, user_id=user_id) as mem:
        hits = mem.search(query, user_id=user_id, limit=limit, **filters)
    if as_json:
        _print_json([h.to_dict() for h in hits])
        return
    if not hits:
        click.echo("(no match)", err=True)
    for h in hits:
        path = " › ".join(h.path)
        click.echo(f"{h.score:.4f}  #{h.exchange.seq}  [{path}]  {h.exchange.user_text[:100]}")


@main.command(help="Show the topic tree of a user.")
@db_option
@user_option
@click.option("--depth", default=99, help="Levels to show.")
@json_option
@cli_errors
def tree(db: str | None, user_id: str, depth: int, as_json: bool) -> None:
    with _existing(db, "hash", user_id=user_id) as mem:  # reading the tree needs no embedding model
        root = mem.tree(user_id=user_id)
    if as_json:
        _print_json(root.to_dict())
    else:
        print_tree(root, max_depth=depth)


@main.command(help="Counts of exchanges, topics (LLM-labelled ones too) and tokens for a user.")
@db_option
@user_option
@json_option
@cli_errors
def stats(db: str | None, user_id: str, as_json: bool) -> None:
    with _existing(db, "hash", user_id=user_id) as mem:
        s = mem.stats(user_id=user_id)
    if as_json:
        _print_json(s.to_dict())
    else:
        for key, value in s.to_dict().items():
            if key != "llm":
                click.echo(f"{key:18} {value}")
        # Calls are counted per process (the runner's), so a one-shot command shows its own.
        click.echo(f"{'llm calls':18} {s.llm.summary() if s.llm is not None else 'no LLM configured'}")


@main.command(help="Forget a topic or theme: delete every exchange filed under it. Without --yes "
                   "only previews exactly which exchanges and topics would go.")
@db_option
@user_option
@click.option("--topic", "topic_id", required=True, help="Topic or theme id (shown by `arbormem tree --json`).")
@click.option("--yes", is_flag=True, help="Delete them (a theme of several topics included).")
@json_option
@cli_errors
def forget(db: str | None, user_id: str, topic_id: str, yes: bool, as_json: bool) -> None:
    with _existing(db, "hash", user_id=user_id) as mem:  # deleting needs no embedding model
        r = mem.forget_topic(topic_id, user_id=user_id, dry_run=True)
        heads = [mem.get(x) for x in r.exchange_ids]  # read before they go
        if yes:  # exactly what was previewed, or refused if the topic changed meanwhile
            r = mem.forget_topic(topic_id, user_id=user_id, confirm=True, expect_exchanges=r.exchange_count)
    if as_json:
        _print_json(r.to_dict())
        return
    what = f"{r.kind} {' › '.join(r.path) or r.title or '(untitled)'} ({r.topic_id})"
    counts = f"{r.exchange_count} exchanges in {r.topic_count} topic{'s' if r.topic_count != 1 else ''}"
    click.echo(f"{'forgot' if r.applied else 'would forget'} {what}: {counts}")
    for ex in heads:
        click.echo(f"  #{ex.seq}  {ex.id}  {ex.user_text[:80]!r}")
    if not r.applied:
        click.echo("run again with --yes to delete them")


@main.command(help="Re-embed a memory's exchanges and topics with another embedder (resumable).")
@click.argument("db", required=False)
@click.option("--embedder", required=True,
              help="The new embedder: 'local', 'hash:DIM', 'openai:MODEL@URL' or a model folder.")
@click.option("--user", "user_id", default=None,
              help="Only this user now (the memory switches embedder once every user is done).")
@click.option("--batch-size", default=256, show_default=True, type=click.IntRange(1, 100_000),
              help="Texts per embedder call.")
@click.option("--database-url", default=None, help="A PostgreSQL memory (postgresql://...) instead of DB.")
@click.option("--force", is_flag=True, help="Re-embed even if the memory already records this embedder.")
@click.option("--quiet", is_flag=True, help="No progress lines on stderr.")
@json_option
@cli_errors
def reembed(db: str | None, embedder: str, user_id: str | None, batch_size: int,
            database_url: str | None, force: bool, quiet: bool, as_json: bool) -> None:
    """Rewrite every vector of the memory at DB (a SQLite file) or --database-url with the
    new embedder, one transaction per user. Interrupted runs resume where they stopped;
    until every user is done the memory refuses reads and writes. Stop other writers first."""
    from .models import ReembedProgress

    if (db is None) == (database_url is None):
        raise ValidationError("give the SQLite memory file DB or --database-url (one of them)")
    if db is not None and not Path(db).exists():
        raise ValidationError(f"no SQLite memory at {db}")

    def progress(p: ReembedProgress) -> None:
        if not quiet:
            click.echo(f"{p.user_id}: {p.done}/{p.total} exchanges", err=True)

    with _memory(db, embedder, database_url=database_url) as mem:
        r = mem.reembed(user_id=user_id, batch_size=batch_size, progress=progress, force=force)
    if as_json:
        _print_json(r.to_dict())
        return
    if r.complete and not r.users and not r.skipped and r.previous == r.embedder:
        click.echo(f"the memory already uses {r.embedder}: nothing to do (--force re-embeds anyway)")
        return
    done = f"re-embedded {len(r.users)} user(s): {r.exchanges} exchange and {r.topics} topic vectors"
    if r.aliases_dropped:
        done += f", {r.aliases_dropped} merged-topic part vectors dropped"
    if r.skipped:
        done += f" ({len(r.skipped)} user(s) done by an earlier run)"
    click.echo(f"{done} in {r.seconds:.1f}s")
    if r.complete:
        click.echo(f"the memory now uses {r.embedder} (was {r.previous})")
    else:
        click.echo(f"{len(r.pending)} user(s) still to re-embed ({', '.join(r.pending[:5])}"
                   f"{', ...' if len(r.pending) > 5 else ''}): the memory keeps {r.previous} and refuses "
                   "reads and writes until they are done")


@main.command("rebuild-tree", help="Rebuild the topic tree from the transcript (after an upgrade).")
@click.argument("db", required=False)
@click.option("--user", "user_id", default=None, help="Only this user (default: every user).")
@click.option("--database-url", default=None, help="A PostgreSQL memory (postgresql://...) instead of DB.")
@json_option
@cli_errors
def rebuild_tree(db: str | None, user_id: str | None, database_url: str | None, as_json: bool) -> None:
    """Drop every topic of the memory at DB (or --database-url) and place each stored exchange
    again with the current placement, one transaction per user. The transcript and its
    vectors are kept; consolidation's merges and links go with the old topics."""
    if (db is None) == (database_url is None):
        raise ValidationError("give the SQLite memory file DB or --database-url (one of them)")
    if db is not None and not Path(db).is_file():
        raise ValidationError(f"no SQLite memory at {db}")
    with _memory(db, database_url=database_url) as mem:
        out = mem.rebuild_tree(user_id)
    if as_json:
        _print_json(out)
        return
    for uid, n in out.items():
        click.echo(f"{uid}: {n} topics")


def _register_subcommands() -> None:
    """Attach the command groups that live with their subsystems. Their modules import only
    click and arbormem at the top (optional dependencies load inside the commands), so an
    ImportError here is a bug and must surface, not hide a command."""
    from .check_cli import check_command
    from .eval.cli import bench_command, bench_threads_command, eval_group
    from .organize.cli import bench_consolidate_command, consolidate_command
    from .server.cli import chat, mcp, serve
    from .store.cli import migrate_store

    main.add_command(eval_group, "eval")
    main.add_command(bench_command, "bench")
    main.add_command(bench_threads_command, "bench-threads")
    main.add_command(consolidate_command, "consolidate")
    main.add_command(bench_consolidate_command, "bench-consolidate")
    main.add_command(migrate_store, "migrate-store")
    main.add_command(serve, "serve")
    main.add_command(mcp, "mcp")
    main.add_command(chat, "chat")
    main.add_command(check_command, "check")


if __name__ == "__main__":  # pragma: no cover
    # ``python -m arbormem.cli``: this file runs as ``__main__``, a second copy of the module.
    # The subcommand modules import ``arbormem.cli`` for its helpers, so registering them from
    # this copy would import them mid-way through; run the importable module's ``main``.
    from arbormem.cli import main as _main

    _main()
elif __name__ != "__mp_main__":
    # A process that multiprocessing spawns (the bench's children) re-runs the parent's
    # ``__main__`` as ``__mp_main__``: under ``python -m arbormem.cli`` that is this file,
    # and registering from that copy would import the subcommand modules mid-way, as above.
    _register_subcommands()
