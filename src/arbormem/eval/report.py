"""Reports people look at: markdown tables and PNG charts for eval and bench runs.

Charts need matplotlib (``pip install 'arbormem[eval]'``); it is imported only when a chart is
written, with the Agg backend so no display is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .locomo import CATEGORIES, SCORED_CATEGORIES

if TYPE_CHECKING:
    from .bench import BenchReport
    from .runner import LocomoReport

ATTRIBUTION = (
    "Data: LoCoMo (Maharana et al., \"Evaluating Very Long-Term Conversational Memory of LLM "
    "Agents\", ACL 2024; snap-research/locomo, CC BY-NC 4.0)."
)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(str(h) for h in header) + " |"]
    lines.append("|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|")
    lines.extend("| " + " | ".join(str(c) for c in row) + " |" for row in rows)
    return "\n".join(lines)


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError("charts need matplotlib: pip install 'arbormem[eval]'") from exc
    return plt


# Long: a linear report, section by section, as it reads in BENCHMARKS.md.
def locomo_markdown(rep: LocomoReport) -> str:
    """The LoCoMo report: recall by budget for every system, arbormem's lead, per category,
    the relevance floor's cost and the null-question check."""
    from .runner import ARBORMEM, ARBORMEM_NOFLOOR, NULL_SHARE, OURS, SYSTEM_LABELS

    budgets = rep.budgets
    head = ["system", *[f"{b}" for b in budgets]]
    out = [
        f"### LoCoMo evidence recall by token budget ({rep.conversations} conversations, "
        f"{rep.exchanges} exchanges, {rep.questions} questions of categories 1-4)",
        "",
        f"arbormem {rep.version}; store {rep.store}; embedder `{rep.embedder}`; tokens counted with cl100k_base; "
        f"{rep.machine}; {rep.date}.",
        "",
        "Evidence recall (share of evidence turns verbatim in the context):",
        "",
    ]
    rows = [
        [SYSTEM_LABELS.get(s, s), *[f"{rep.score(s, b).evidence_recall:.3f}" for b in budgets]]
        for s in rep.systems
    ]
    if len(rep.systems) > 1:
        rows.append(
            ["**arbormem lead over best baseline**",
             *[f"{rep.lead(b):+.3f} (vs {rep.best_baseline(b).system})" for b in budgets]]
        )
    if "hybrid" in rep.systems:
        rows.append(
            ["arbormem lead over flat hybrid",
             *[f"{rep.score('arbormem', b).evidence_recall - rep.score('hybrid', b).evidence_recall:+.3f}"
               for b in budgets]]
        )
    out += [_table(head, rows), ""]
    if "hybrid" in rep.systems and rep.results:
        spans = [rep.lead_interval(b, "hybrid") for b in budgets]
        out += ["Lead over the flat hybrid, 95% paired bootstrap interval over questions:", "",
                _table(["", *[str(b) for b in budgets]],
                       [["lead interval", *[f"{lo:+.3f} .. {hi:+.3f}" for lo, hi in spans]]]), ""]
        convs = list(rep.per_conversation(ARBORMEM, budgets[0]))
        if len(convs) > 1:
            per = {(s, b): rep.per_conversation(s, b) for s in (ARBORMEM, "hybrid") for b in budgets}
            conv_rows = [[f"{SYSTEM_LABELS.get(s, s)} @ {b}", *[f"{recall[c]:.3f}" for c in convs]]
                         for (s, b), recall in per.items()]
            out += ["Evidence recall per conversation:", "",
                    _table(["system @ budget", *convs], conv_rows), ""]
    if all(s in rep.systems for s in OURS):
        out += [f"Cost of the relevance floor (min_relevance {rep.min_relevance:g}): evidence recall / mean "
                "context tokens, floor on (the default) and off (min_relevance 0, the budget filled):", "",
                _table(head, [[SYSTEM_LABELS.get(s, s),
                               *[f"{rep.score(s, b).evidence_recall:.3f} / {rep.score(s, b).mean_tokens:.0f}"
                                 for b in budgets]] for s in OURS]
                       + [["change with the floor",
                           *[f"{rep.score(ARBORMEM, b).evidence_recall - rep.score(ARBORMEM_NOFLOOR, b).evidence_recall:+.3f}"
                             f" / {rep.score(ARBORMEM, b).mean_tokens - rep.score(ARBORMEM_NOFLOOR, b).mean_tokens:+.0f}"
                             for b in budgets]]]), ""]
    if rep.null_check:
        n = rep.null_check[0].questions
        out += [f"Null questions: each conversation's memory asked the other conversations' questions "
                f"({n} asks; nothing in the memory answers them). Share answered with <= {NULL_SHARE:.0%} "
                "of the budget, mean tokens, and share of search() calls with no hit:", "",
                _table(["floor", "budget", "answered with <= 15% of the budget", "mean tokens",
                        "search() with no hit"],
                       [["on" if x.floor else "off", x.budget, f"{x.quiet_share:.3f}", f"{x.mean_tokens:.0f}",
                         f"{x.search_empty_share:.3f}"] for x in rep.null_check]), ""]
    out += ["recall_all (share of questions with every evidence turn present):", ""]
    out.append(_table(head, [
        [SYSTEM_LABELS.get(s, s), *[f"{rep.score(s, b).recall_all:.3f}" for b in budgets]]
        for s in rep.systems
    ]))
    out += ["", "Mean context tokens used (independent cl100k count):", ""]
    out.append(_table(head, [
        [SYSTEM_LABELS.get(s, s), *[f"{rep.score(s, b).mean_tokens:.0f}" for b in budgets]]
        for s in rep.systems
    ]))
    out += ["", "Evidence recall per category:", ""]
    cat_rows = []
    for s in rep.systems:
        for c in SCORED_CATEGORIES:
            try:
                cells = [rep.score(s, b, c) for b in budgets]
            except KeyError:
                continue
            cat_rows.append([SYSTEM_LABELS.get(s, s), f"{c} {CATEGORIES[c]} (n={cells[0].questions})",
                             *[f"{x.evidence_recall:.3f}" for x in cells]])
    out.append(_table(["system", "category", *[str(b) for b in budgets]], cat_rows))
    over = {s: sum(rep.score(s, b).over_budget for b in budgets) for s in rep.systems}
    out += [
        "",
        f"Full context: {rep.mean_full_context_tokens():,.0f} tokens per conversation on average "
        f"(evidence recall 1.000 by construction).",
        f"Checks: contexts over budget: {', '.join(f'{s} {n}' for s, n in over.items())}; "
        f"arbormem token count differing from the independent count: {rep.token_mismatches}.",
        f"arbormem recall latency: mean {rep.recall_ms['mean']:.1f} ms, p50 {rep.recall_ms['p50']:.1f} ms, "
        f"p95 {rep.recall_ms['p95']:.1f} ms; ingest {rep.ingest_seconds:.1f} s; run {rep.seconds:.0f} s.",
        "",
        ATTRIBUTION,
    ]
    if rep.skipped_questions:
        out.insert(-2, f"Questions of categories 1-4 left out for having no usable evidence ids: "
                       f"{rep.skipped_questions}.")
    return "\n".join(out) + "\n"


def locomo_chart(rep: LocomoReport, path: str | Path) -> Path:
    """Evidence recall vs budget, one line per system, written as a PNG."""
    from .runner import ARBORMEM, SYSTEM_LABELS

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=120)
    for s in rep.systems:
        ys = [rep.score(s, b).evidence_recall for b in rep.budgets]
        ax.plot(rep.budgets, ys, marker="o", linewidth=2.5 if s == ARBORMEM else 1.4,
                label=SYSTEM_LABELS.get(s, s))
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(rep.budgets))
    ax.set_xticklabels([str(b) for b in rep.budgets])
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("token budget (cl100k)")
    ax.set_ylabel("evidence recall")
    ax.set_title(f"LoCoMo evidence recall ({rep.questions} questions, {rep.embedder})", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out


def _stage_table(rep: BenchReport) -> list[str]:
    """Recall's stages (p50 ms, ``Recall.trace.timings_ms``) per row, when the run kept them."""
    order = ("query", "embed", "lexical", "indexes", "fuse", "expand", "pack", "render", "total")
    rows = [r for r in rep.results if r.stage_ms]
    if not rows:
        return []
    keys = [k for k in order if any(k in r.stage_ms for r in rows)]
    body = [[r.workload, f"{r.size:,}", *(f"{r.stage_ms[k]:.1f}" if k in r.stage_ms else "-" for k in keys),
             str(r.torch_threads or "-"), f"{r.load_avg[0]:.1f} -> {r.load_avg[1]:.1f}"] for r in rows]
    return ["Recall stages, p50 ms (`lexical` runs alongside `embed`):", "",
            _table(["workload", "exchanges", *keys, "torch threads", "load average"], body), ""]


def bench_markdown(rep: BenchReport) -> str:
    """The bench report: throughput and latency as ratios to the embedder, memory, disk."""
    head = ["workload", "exchanges", "raw embed /s", "bulk ingest /s", "bulk / raw",
            "begin+complete /s", "one-by-one / raw", "background /s", "background / raw", "background / raw of its texts", "1-query embed p50 ms", "recall p50 / p95 / p99 ms",
            "recall p50 / 1-query embed", "p95 ratio", "p99 ratio", "peak RSS MB (after model load)",
            "bytes / exchange"]
    rows = []
    multi = len({r.embedder for r in rep.results}) > 1
    for r in rep.results:
        rows.append([
            f"{r.workload} ({r.embedder})" if multi else r.workload, f"{r.size:,}", f"{r.raw_embed_per_s:,.0f}", f"{r.bulk_per_s:,.0f}",
            f"{r.bulk_ratio:.2f}x", f"{r.one_by_one_per_s:,.1f}", f"{r.one_by_one_ratio:.3f}x",
            f"{r.background_per_s:,.1f}" if r.background_per_s else "-",
            f"{r.background_ratio:.3f}x" if r.background_per_s else "-",
            f"{r.background_per_s / r.singles_raw_per_s:.3f}x" if r.background_per_s and r.singles_raw_per_s else "-",
            f"{r.one_query_embed_ms['p50']:.1f}",
            f"{r.recall_ms['p50']:.1f} / {r.recall_ms['p95']:.1f} / {r.recall_ms['p99']:.1f}",
            f"{r.recall_ratio['p50']:.2f}x", f"{r.recall_ratio['p95']:.2f}x", f"{r.recall_ratio['p99']:.2f}x",
            f"{r.peak_rss_mb:,.0f} ({r.base_rss_mb:,.0f})", f"{r.bytes_per_exchange:,.0f}",
        ])
    emb = ", ".join(sorted({r.embedder for r in rep.results}))
    out = [
        "### arbormem bench",
        "",
        f"arbormem {rep.version}; embedder `{emb}`; {rep.machine}; {rep.date}."
        + (f" Command: `{rep.command}`." if rep.command else ""),
        "",
        _table(head, rows),
        "",
        *_stage_table(rep),
        "Ratios compare with the same embedder on the same texts in the same process: bulk and "
        "one-by-one ingest throughput over raw batch-embedding throughput (higher is better, 1.0 "
        "= ingest costs no more than embedding); recall latency over embedding one query "
        "(lower is better). One-by-one cannot batch its embeddings inline, so it is bounded by "
        "single-text embedding latency; *background* is the same begin+complete loop with "
        "background placement (`ARBORMEM_PLACEMENT=background`: a worker embeds and places the "
        "queued exchanges in batches), timed up to the end of the final `flush()`; "
        "*of its texts*: over raw embedding of the same texts in the groups the worker embeds "
        "them in (by length, for a model that pads its batches).",
    ]
    for note in rep.notes:
        out += ["", note]
    return "\n".join(out) + "\n"


def bench_chart(rep: BenchReport, path: str | Path) -> Path:
    """Recall latency (p50, p95) and one-query embedding time vs memory size, as a PNG."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=120)
    multi = len({r.embedder for r in rep.results}) > 1
    for n, (workload, embedder) in enumerate(sorted({(r.workload, r.embedder) for r in rep.results})):
        rs = sorted((r for r in rep.results if (r.workload, r.embedder) == (workload, embedder)),
                    key=lambda r: r.size)
        if multi:
            workload = f"{workload}, {embedder}"
        xs = [r.size for r in rs]
        color = f"C{n}"  # one colour per workload, one line style per measure
        ax.plot(xs, [r.recall_ms["p50"] for r in rs], marker="o", color=color,
                label=f"recall p50 ({workload})")
        ax.plot(xs, [r.recall_ms["p95"] for r in rs], marker="^", linestyle="--", color=color,
                label=f"recall p95 ({workload})")
        ax.plot(xs, [r.one_query_embed_ms["p50"] for r in rs], marker="s", linestyle=":",
                color=color, label=f"embed one query p50 ({workload})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("exchanges in memory")
    ax.set_ylabel("milliseconds")
    ax.set_title("arbormem recall latency vs memory size", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out
