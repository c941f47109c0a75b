"""``arbormem bench``: ingest throughput, recall latency, memory and disk at a given size.

Every speed figure is a ratio to the embedder measured in the same run on the same texts, so
numbers from different machines compare: bulk ingest and one-by-one ``begin/complete``
throughput against raw batch embedding throughput, and recall latency percentiles against
embedding one query. One-by-one ingest is measured twice on the same texts: inline placement
(the default: ``complete`` embeds and places) and background placement (``complete`` returns,
a worker places in batches; timed up to the end of the final ``flush``, the honest end of
ingest), with a second ``Memory`` on the same database. Each size runs in a fresh process
(``isolate=True``) so peak RSS is that size's own, not the largest run's so far.

Workloads:
- ``synthetic``: deterministic chat-like exchanges on many subjects (seeded generator).
- ``locomo``: the turns of LoCoMo files paired into exchanges, repeated with shifted dates
  until the size is reached (needs ``locomo_files``).
"""

from __future__ import annotations

import os
import random
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np

from .. import validate
from ..errors import ConfigError
from ..models import Serializable, exchange_text

WORKLOADS = ("synthetic", "locomo")


@dataclass(frozen=True)
class BenchConfig(Serializable):
    """One bench run at one size (picklable, so it can run in a child process)."""

    size: int
    workload: str = "synthetic"
    embedder: str = "local"
    locomo_files: tuple[str, ...] = ()
    queries: int = 200
    one_by_one: int = 300
    budget: int = 1024
    chunk: int = 500
    raw_sample: int = 10_000
    seed: int = 7
    db_dir: str | None = None
    progress: bool = True
    store: str = "sqlite"
    #: postgres: an empty database (``arbormem bench`` creates one per size on its own server)
    database_url: str | None = None


@dataclass(frozen=True)
class BenchResult(Serializable):
    """Measured figures of one size. Throughputs in exchanges (texts) per second, times in ms."""

    size: int
    workload: str
    embedder: str
    raw_embed_per_s: float
    raw_embed_texts: int
    bulk_per_s: float
    bulk_ratio: float
    one_by_one_per_s: float
    one_by_one_ratio: float
    one_by_one_ms_p50: float
    one_query_embed_ms: dict[str, float]
    recall_ms: dict[str, float]
    recall_ratio: dict[str, float]
    recall_tokens_mean: float
    peak_rss_mb: float
    base_rss_mb: float
    disk_bytes: int
    bytes_per_exchange: float
    seconds: float
    store: str = "sqlite"
    #: Recall's stages, p50 ms over the timed recalls (``Recall.trace.timings_ms``: query,
    #: embed, lexical (alongside the embedding), indexes, fuse, expand, pack, render, total).
    stage_ms: dict[str, float] = field(default_factory=dict)
    #: The torch threads setting and the machine's 1-minute load average before and after
    #: (figures from a shared machine are only comparable within one run).
    torch_threads: int = 0
    load_avg: tuple[float, float] = (0.0, 0.0)
    #: One-by-one ingest with background placement (``Settings.placement``): the same texts
    #: as the inline row, re-dated after it, timed including the final ``flush``; the ratio is
    #: over ``raw_embed_per_s`` like the others. 0 in reports made before it existed.
    background_per_s: float = 0.0
    background_ratio: float = 0.0
    #: p50 of one begin+complete call in background mode (the host app's wait), ms.
    background_ms_p50: float = 0.0
    #: Raw embedding of the one-by-one texts, measured round by round beside the two
    #: one-by-one runs, in the groups background placement embeds them in (by length when the
    #: embedder pads batches, ``backlog.length_groups``): ``background_per_s`` over this is
    #: background ingest against embedding the same texts the same way.
    singles_raw_per_s: float = 0.0


@dataclass(frozen=True)
class BenchReport(Serializable):
    results: tuple[BenchResult, ...]
    machine: str
    date: str
    command: str = ""
    notes: tuple[str, ...] = field(default=())
    version: str = ""


# -- workloads --------------------------------------------------------------------------------

_SUBJECTS = {
    "garden": "tomatoes basil compost seedlings trellis mulch aphids watering raised-bed zucchini",
    "running": "marathon intervals tempo shoes knee hamstring pace splits hydration trail",
    "cooking": "risotto stock saffron oven dough sourdough starter knife braise caramel",
    "travel": "flight hostel itinerary visa train passport museum ferry luggage rental",
    "finance": "budget mortgage savings index-fund taxes invoice pension interest receipts loan",
    "music": "guitar chords metronome scales piano rehearsal amplifier setlist lyrics tuning",
    "work": "deadline manager promotion standup roadmap interview onboarding review sprint client",
    "health": "dentist allergy vitamins sleep migraine prescription checkup blood-test clinic therapy",
    "pets": "puppy leash vet kibble litter training crate adoption grooming fetch",
    "home": "plumber paint kitchen leak tiles landlord furniture curtains insulation boiler",
    "study": "thesis lecture exam flashcards statistics library seminar essay supervisor grades",
    "family": "birthday niece grandmother wedding cousins reunion anniversary babysitting gifts holiday",
    "code": "python refactor database migration tests deploy docker latency bug index",
    "books": "novel chapter author library bookclub poetry memoir translation sequel paperback",
    "cycling": "bike gears saddle commute helmet puncture chain climb route cadence",
    "photography": "lens aperture tripod sunrise portrait exposure darkroom film editing prints",
}
_NAMES = "Ana Ben Chloe Dev Elif Femi Goran Hana Ivo Jia Kofi Lena Mateo Noor Omar Pia".split()
_USER_T = (
    "I spent the {d} on {a} and {b}, and {n} thinks the {c} still needs work.",
    "Quick update on {a}: the {b} went fine but I'm worried about the {c}.",
    "Can you remind me what we decided about {a} and the {b} last {d}?",
    "{n} suggested I try {a} with more {b}; is that a good idea before {c}?",
)
_ASSIST_T = (
    "Sounds like progress on {a}. For the {b}, keep notes; {c} usually improves within a {d} or two.",
    "You mentioned {n} earlier. Focus on {a} first, then {b}, and check the {c} again next {d}.",
    "A good plan: write down the {b} details, ask {n} about {c}, and revisit {a} on the {d}.",
)


def synthetic_items(size: int, seed: int = 7) -> tuple[list[dict[str, Any]], list[str]]:
    """``size`` exchanges (add_many items) and a pool of queries about them, deterministic."""
    rng = random.Random(seed)
    subjects = {k: v.split() for k, v in _SUBJECTS.items()}
    keys = sorted(subjects)
    start = datetime(2024, 1, 1, 9, 0, tzinfo=timezone.utc)
    items: list[dict[str, Any]] = []
    queries: list[str] = []
    subject = rng.choice(keys)
    for i in range(size):
        if i % 6 == 0:  # people stay on a subject for a few exchanges
            subject = rng.choice(keys)
        words = subjects[subject]
        fill = {
            "a": rng.choice(words), "b": rng.choice(words), "c": rng.choice(words),
            "n": rng.choice(_NAMES), "d": rng.choice(("week", "weekend", "month", "morning")),
        }
        user = rng.choice(_USER_T).format(**fill) + f" (note {i})"
        assistant = rng.choice(_ASSIST_T).format(**fill)
        at = start + timedelta(days=i // 12, minutes=5 * (i % 12))
        items.append({
            "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}],
            "session_id": f"s{i // 12}",
            "at": at,
        })
        if len(queries) < 5000 and rng.random() < 0.2:
            queries.append(f"What did {fill['n']} say about {fill['a']} and {fill['b']}?")
    return items, queries or ["what did we discuss?"]


def locomo_items(files: Sequence[str], size: int) -> tuple[list[dict[str, Any]], list[str]]:
    """LoCoMo exchanges repeated (dates shifted by a year per pass) up to ``size``."""
    from .locomo import load_conversations

    if not files:
        raise ConfigError("the locomo workload needs LoCoMo files (--locomo FILE...)")
    convs = load_conversations(files)
    units = [u for c in convs for u in c.units()]
    queries = [q.question for c in convs for q in c.scored_questions()]
    if not units:
        raise ConfigError("the LoCoMo files hold no dialogue")
    items: list[dict[str, Any]] = []
    rep = 0
    while len(items) < size:
        for u in units:
            if len(items) >= size:
                break
            items.append({
                "messages": u.messages(),
                "session_id": f"{u.conversation}-s{u.session}-r{rep}",
                "at": u.at + timedelta(days=366 * rep),
            })
        rep += 1
    items.sort(key=lambda it: it["at"])
    return items, queries


def _item_text(item: dict[str, Any]) -> str:
    """The text arbormem embeds for an exchange (``Exchange.text``)."""
    _, user, assistant = validate.messages(item["messages"], limit=1 << 30)
    return exchange_text(user, assistant)


# -- measurement helpers ----------------------------------------------------------------------

def _rss_mb() -> float:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _PeakRSS:
    """Samples RSS in a thread: the peak during the block (works in-process too)."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_mb())
            self._stop.wait(self.interval)

    def __enter__(self) -> _PeakRSS:
        self.peak = _rss_mb()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_mb())


def _load() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # not on this platform
        return 0.0


def _torch_threads() -> int:
    """torch's intra-op threads if torch is loaded (the local embedder sets them), else 0."""
    torch = sys.modules.get("torch")
    return int(torch.get_num_threads()) if torch is not None else 0


def _pcts(ms: Sequence[float]) -> dict[str, float]:
    a = np.asarray(ms, dtype=np.float64)
    return {
        "p50": float(np.percentile(a, 50)),
        "p95": float(np.percentile(a, 95)),
        "p99": float(np.percentile(a, 99)),
        "mean": float(a.mean()),
    }


def _db_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*") if p.is_file())


def _pg_bytes(store: Any) -> int:
    """Size of the whole PostgreSQL database (meaningful when the bench had it to itself)."""
    return int(store.database_bytes())


# -- the run ----------------------------------------------------------------------------------

def _one_by_one(mem: Any, items: Sequence[dict[str, Any]]) -> list[float]:
    """``begin`` + ``complete`` per item; returns each pair's milliseconds."""
    out = []
    for it in items:
        msgs = it["messages"]
        t1 = time.perf_counter()
        x = mem.begin(msgs[0]["content"], user_id="bench", session_id=it["session_id"], at=it["at"])
        if len(msgs) > 1:
            mem.complete(x.id, msgs[1]["content"], at=it["at"])
        out.append((time.perf_counter() - t1) * 1000)
    return out


def bench_size(cfg: BenchConfig, embedder: Any = None) -> BenchResult:
    """Run one size: raw embedding, bulk ingest, one-by-one ingest, recall latency, disk."""
    from tqdm import tqdm

    from ..backlog import length_groups
    from ..config import Settings
    from ..embed import make_embedder
    from ..memory import Memory

    t_start = time.perf_counter()
    load_before = _load()
    emb = embedder if embedder is not None else make_embedder(cfg.embedder)
    total = cfg.size + cfg.one_by_one
    if cfg.workload == "synthetic":
        items, queries = synthetic_items(total, cfg.seed)
    elif cfg.workload == "locomo":
        items, queries = locomo_items(cfg.locomo_files, total)
    else:
        raise ConfigError(f"unknown workload {cfg.workload!r}; choose from {', '.join(WORKLOADS)}")
    bulk, singles = items[: cfg.size], items[cfg.size :]
    texts = [_item_text(it) for it in bulk]
    rng = random.Random(cfg.seed + 1)
    queries = [rng.choice(queries) for _ in range(cfg.queries)]
    desc = f"{cfg.workload} {cfg.size:,}"

    emb.embed(texts[:16])  # load the model and warm up outside the timings
    base_rss = _rss_mb()
    with _PeakRSS() as peak:
        # Raw embedding and ingest run interleaved, chunk by chunk (and query by query below),
        # so a neighbour's load on a shared machine slows both sides of each ratio alike.
        step = max(cfg.chunk, 1)
        starts = list(range(0, len(bulk), step))
        # Embed raw at most ``raw_sample`` texts, spread evenly over the run (a 100k store
        # ingests slower at the end than at the start).
        stride = max(1, -(-len(starts) // max(1, -(-cfg.raw_sample // step))))
        # The database lives in a temporary folder removed even when the run is interrupted.
        with tempfile.TemporaryDirectory(prefix="arbormem-bench-", dir=cfg.db_dir) as tmp:
            db = Path(tmp) / "bench.db"
            if cfg.store == "postgres" and not cfg.database_url:
                raise ConfigError("the postgres bench needs a database URL")
            if cfg.store not in ("sqlite", "postgres"):
                raise ConfigError(f"unknown store {cfg.store!r}; choose sqlite or postgres")

            def open_memory(settings: Settings | None = None) -> Memory:
                """The bench's memory (a second one on the same database for background mode)."""
                if cfg.store == "postgres":
                    return Memory(database_url=cfg.database_url, embedder=emb, settings=settings)
                return Memory(str(db), embedder=emb, settings=settings)

            mem = open_memory()
            if cfg.store == "postgres" and any(mem.store.count_exchanges("bench").values()):
                mem.close()
                raise ConfigError("the database already holds a 'bench' user; give an empty database")
            try:
                raw_s = bulk_s = 0.0
                raw_n = 0
                for j, i in enumerate(tqdm(starts, desc=f"{desc}: bulk ingest + raw embed",
                                           disable=not cfg.progress, leave=False)):
                    if j % stride == 0:
                        t0 = time.perf_counter()
                        emb.embed(texts[i : i + step])
                        raw_s += time.perf_counter() - t0
                        raw_n += len(texts[i : i + step])
                    t0 = time.perf_counter()
                    mem.add_many(bulk[i : i + step], user_id="bench")
                    bulk_s += time.perf_counter() - t0
                raw_tput = raw_n / raw_s if raw_s > 0 else float("inf")

                # One-by-one begin/complete appended to the full store: inline placement, then
                # the same texts (re-dated after them) through a second Memory on the same
                # database with background placement, timed up to the end of its flush. Run in
                # rounds, each with a raw embedding of its texts, so a neighbour's load on a
                # shared machine falls on both modes (and is seen in singles_raw_per_s).
                bg = open_memory(Settings(placement="background"))
                try:
                    shift = (singles[-1]["at"] - singles[0]["at"] + timedelta(days=1)) if singles else timedelta(0)
                    again = [{**it, "at": it["at"] + shift, "session_id": f"{it['session_id']}-bg"} for it in singles]
                    single_ms, bg_ms = [], []
                    singles_s = bg_s = single_raw_s = 0.0
                    per_round = max(1, -(-len(singles) // 3))
                    for r0 in tqdm(range(0, len(singles), per_round), desc=f"{desc}: begin/complete",
                                   disable=not cfg.progress, leave=False):
                        part = singles[r0 : r0 + per_round]
                        part_texts = [_item_text(it) for it in part]
                        groups = (length_groups([len(t) for t in part_texts])
                                  if getattr(emb, "pads_batches", False) else [list(range(len(part)))])
                        t0 = time.perf_counter()
                        for g in groups:
                            emb.embed([part_texts[i] for i in g])
                        single_raw_s += time.perf_counter() - t0
                        t0 = time.perf_counter()
                        single_ms += _one_by_one(mem, part)
                        singles_s += time.perf_counter() - t0
                        t0 = time.perf_counter()
                        bg_ms += _one_by_one(bg, again[r0 : r0 + per_round])
                        bg.flush("bench")  # ingest ends when the last exchange is placed
                        bg_s += time.perf_counter() - t0
                finally:
                    bg.close()

                # recall latency, each call paired with embedding the same query alone
                mem.recall(queries[0], user_id="bench", max_tokens=cfg.budget)  # warm caches
                one_q, recall_ms, tokens = [], [], []
                stages: dict[str, list[float]] = {}
                for q in tqdm(queries, desc=f"{desc}: recall", disable=not cfg.progress, leave=False):
                    t0 = time.perf_counter()
                    emb.embed([q])
                    one_q.append((time.perf_counter() - t0) * 1000)
                    t0 = time.perf_counter()
                    r = mem.recall(q, user_id="bench", max_tokens=cfg.budget)
                    recall_ms.append((time.perf_counter() - t0) * 1000)
                    tokens.append(r.tokens)
                    for stage, ms in r.trace.timings_ms.items():
                        stages.setdefault(stage, []).append(ms)
                disk = _pg_bytes(mem.store) if cfg.store == "postgres" else 0
            finally:
                mem.close()
            disk = disk or _db_bytes(db)

    n_single = len(singles)
    bulk_tput = len(bulk) / bulk_s if bulk_s > 0 else float("inf")
    single_tput = n_single / singles_s if n_single and singles_s > 0 else 0.0
    bg_tput = n_single / bg_s if n_single and bg_s > 0 else 0.0
    q_ms = _pcts(one_q)
    rc = _pcts(recall_ms)
    return BenchResult(
        size=cfg.size,
        workload=cfg.workload,
        embedder=getattr(emb, "name", type(emb).__name__),
        raw_embed_per_s=raw_tput,
        raw_embed_texts=raw_n,
        bulk_per_s=bulk_tput,
        bulk_ratio=bulk_tput / raw_tput,
        one_by_one_per_s=single_tput,
        one_by_one_ratio=single_tput / raw_tput,
        one_by_one_ms_p50=float(np.percentile(single_ms, 50)) if single_ms else 0.0,
        one_query_embed_ms=q_ms,
        recall_ms=rc,
        recall_ratio={k: rc[k] / q_ms[k] for k in ("p50", "p95", "p99")},
        recall_tokens_mean=float(np.mean(tokens)),
        peak_rss_mb=peak.peak,
        base_rss_mb=base_rss,
        disk_bytes=disk,
        bytes_per_exchange=disk / (len(bulk) + 2 * n_single),
        seconds=time.perf_counter() - t_start,
        store=cfg.store,
        stage_ms={k: round(float(np.percentile(v, 50)), 2) for k, v in stages.items()},
        torch_threads=_torch_threads(),
        load_avg=(load_before, _load()),
        background_per_s=bg_tput,
        background_ratio=bg_tput / raw_tput,
        background_ms_p50=float(np.percentile(bg_ms, 50)) if bg_ms else 0.0,
        singles_raw_per_s=n_single / single_raw_s if n_single and single_raw_s > 0 else 0.0,
    )


def _child(cfg: BenchConfig) -> BenchResult:
    import signal
    import sys

    # SIGTERM (a killed parent, a CI timeout) unwinds normally, so the temporary database
    # is removed instead of left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return bench_size(cfg)


def run_bench(
    configs: Sequence[BenchConfig],
    *,
    isolate: bool = True,
    embedder: Any = None,
    on_result: Callable[[BenchResult], None] | None = None,
) -> BenchReport:
    """Run every config; with ``isolate`` each in a fresh process (own peak RSS, own model).

    ``embedder`` (an Embedder instance) is only used in-process (``isolate=False``).
    """
    from .runner import code_version, machine_description

    results = []
    for cfg in configs:
        if isolate and embedder is None:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
                res = pool.submit(_child, cfg).result()
        else:
            res = bench_size(cfg, embedder)
        results.append(res)
        if on_result:
            on_result(res)
    return BenchReport(
        results=tuple(results),
        machine=machine_description(),
        date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        version=code_version(),
    )


def load_report(path: str | Path) -> BenchReport:
    """Read a report written by ``arbormem bench --json``."""
    import json

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        results = tuple(BenchResult(**{**r, "load_avg": tuple(r.get("load_avg", (0.0, 0.0)))})
                        for r in data["results"])
        return BenchReport(results, data["machine"], data["date"], data.get("command", ""),
                           tuple(data.get("notes", ())), data.get("version", ""))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a bench report: {exc}") from exc


def merge_reports(new: BenchReport, older: Sequence[BenchReport]) -> BenchReport:
    """``new`` plus the results of ``older`` runs it does not repeat, each noted with its origin."""
    have = {(r.store, r.workload, r.size) for r in new.results}
    results = list(new.results)
    notes = list(new.notes)
    for rep in older:
        extra = [r for r in rep.results if (r.store, r.workload, r.size) not in have]
        if extra:
            have.update((r.store, r.workload, r.size) for r in extra)
            results.extend(extra)
            which = ", ".join(f"{r.workload} {r.size:,}" + ("" if r.store == "sqlite" else f" ({r.store})")
                              for r in extra)
            notes.append(f"Rows {which}: run of {rep.date}, arbormem {rep.version or '?'}, on {rep.machine}"
                         + (f" (`{rep.command}`)." if rep.command else "."))
    results.sort(key=lambda r: (r.store != "sqlite", r.store,
                                WORKLOADS.index(r.workload) if r.workload in WORKLOADS else 99, r.size))
    return replace(new, results=tuple(results), notes=tuple(notes))


__all__ = [
    "WORKLOADS",
    "BenchConfig",
    "BenchReport",
    "BenchResult",
    "bench_size",
    "load_report",
    "merge_reports",
    "locomo_items",
    "run_bench",
    "synthetic_items",
]
