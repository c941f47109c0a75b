"""The LoCoMo evidence-recall evaluation: arbormem and flat baselines in one run.

For every conversation: ingest it through the public ``Memory`` API (one user per
conversation), build the flat baselines over the very same exchange units with the very same
embedder, then for every scored question and every budget ask each system for a context and
score the share of the question's evidence turns whose text stands verbatim in it.

Tokens are counted here with cl100k_base through ``bpe_openai`` directly, not through
``arbormem.tokens``: the library's own ``Recall.tokens`` is checked against this count, and a
context over its budget is reported, never silently accepted.
"""

from __future__ import annotations

import functools
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import numpy as np

from ..models import Serializable
from .baselines import FlatIndex, pack
from .locomo import CATEGORIES, SCORED_CATEGORIES, Conversation, Question, Unit

if TYPE_CHECKING:
    from ..memory import Memory

DEFAULT_BUDGETS = (256, 512, 1024, 2048, 4096)
ARBORMEM = "arbormem"
#: arbormem with the relevance floor off (``min_relevance=0``: the budget filled), the cost side.
ARBORMEM_NOFLOOR = "arbormem-nofloor"
OURS = (ARBORMEM, ARBORMEM_NOFLOOR)
BASELINES = FlatIndex.SYSTEMS
SYSTEMS = (ARBORMEM, ARBORMEM_NOFLOOR, *BASELINES)
#: The null-question check: budgets asked, and the share of a budget that counts as "answered
#: with next to nothing" (the recent window and the frame fit in it).
NULL_BUDGETS = (1024, 2048)
NULL_SHARE = 0.15
SYSTEM_LABELS = {
    ARBORMEM: "arbormem",
    ARBORMEM_NOFLOOR: "arbormem, floor off",
    "recency": "recency (sliding window)",
    "bm25": "BM25 only",
    "dense": "dense only",
    "hybrid": "flat hybrid (BM25+dense, RRF)",
}


@functools.lru_cache(maxsize=1)
def _cl100k() -> Any:
    import bpe_openai

    return bpe_openai.get_encoding("cl100k_base")


def count_tokens(text: str) -> int:
    """cl100k_base token count, computed independently of the library's TokenCounter."""
    return len(_cl100k().encode(text)) if text else 0


def normalize(text: str) -> str:
    """Collapse whitespace, so a renderer re-wrapping lines does not hide a verbatim turn."""
    return " ".join(text.split())


def evidence_found(context: str, evidence_texts: Sequence[str]) -> int:
    """How many evidence turn texts stand verbatim (whitespace-normalised) in ``context``."""
    hay = normalize(context)
    return sum(1 for t in evidence_texts if normalize(t) in hay)


def render_unit(unit: Unit) -> str:
    """How the baselines show one exchange: its session date, then the speakers' lines."""
    return f"[{unit.at.day} {unit.at:%B %Y}] " + unit.text()


@dataclass(frozen=True)
class QuestionResult(Serializable):
    """One system's answer to one question at one budget."""

    conversation: str
    question: int
    category: int
    system: str
    budget: int
    found: int
    evidence: int
    tokens: int

    @property
    def recall(self) -> float:
        return self.found / self.evidence


@dataclass(frozen=True)
class Score(Serializable):
    """Mean evidence recall of one system at one budget (``category=None``: all of 1-4)."""

    system: str
    budget: int
    category: int | None
    questions: int
    evidence_recall: float
    recall_all: float
    mean_tokens: float
    over_budget: int


@dataclass(frozen=True)
class NullScore(Serializable):
    """Questions a memory cannot answer (each conversation's memory asked the other
    conversations' questions), at one budget, floor on (the default) or off."""

    budget: int
    floor: bool
    questions: int
    quiet_share: float      # answered with <= NULL_SHARE of the budget
    mean_tokens: float
    search_empty_share: float  # search() returned no hit


@dataclass(frozen=True)
class LocomoReport(Serializable):
    """Everything one ``arbormem eval locomo`` run measured."""

    files: tuple[str, ...]
    budgets: tuple[int, ...]
    systems: tuple[str, ...]
    embedder: str
    conversations: int
    turns: int
    exchanges: int
    questions: int
    skipped_questions: int
    full_context_tokens: dict[str, int]
    scores: tuple[Score, ...]
    token_mismatches: int
    recall_ms: dict[str, float]
    ingest_seconds: float
    seconds: float
    machine: str
    date: str
    version: str = ""
    results: tuple[QuestionResult, ...] = field(default=(), repr=False)
    store: str = "sqlite"  # the Store class that held arbormem's memory (older reports: SQLite)
    null_check: tuple[NullScore, ...] = ()
    min_relevance: float = 0.0  # the floor the default rows ran with

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LocomoReport:
        """Rebuild a report from its ``to_dict()`` / ``--json`` form."""
        fields = dict(data)
        fields.pop("command", None)
        fields["files"] = tuple(fields.get("files", ()))
        fields["budgets"] = tuple(fields["budgets"])
        fields["systems"] = tuple(fields["systems"])
        fields["scores"] = tuple(Score(**s) for s in fields["scores"])
        fields["results"] = tuple(QuestionResult(**r) for r in fields.get("results", ()))
        fields["null_check"] = tuple(NullScore(**n) for n in fields.get("null_check", ()))
        return cls(**fields)

    def score(self, system: str, budget: int, category: int | None = None) -> Score:
        for s in self.scores:
            if (s.system, s.budget, s.category) == (system, budget, category):
                return s
        raise KeyError((system, budget, category))

    def best_baseline(self, budget: int) -> Score:
        """The baseline with the highest overall evidence recall at ``budget``."""
        cands = [self.score(b, budget) for b in self.systems if b not in OURS]
        return max(cands, key=lambda s: s.evidence_recall)

    def lead(self, budget: int) -> float:
        """arbormem's evidence recall minus the best baseline's at ``budget`` (points of 1.0)."""
        return self.score(ARBORMEM, budget).evidence_recall - self.best_baseline(budget).evidence_recall

    def lead_interval(self, budget: int, versus: str, level: float = 0.95, rounds: int = 2000,
                      seed: int = 0) -> tuple[float, float]:
        """A paired bootstrap interval of arbormem's lead over ``versus`` at ``budget``.

        Questions are resampled with replacement and both systems scored on the same draw, so
        the interval shows how much a lead of this size owes to which questions happened to be
        asked (needs the per-question ``results``; a lead near a target is not a lead over it).
        """
        mine, theirs = self._by_question(ARBORMEM, budget), self._by_question(versus, budget)
        keys = sorted(mine.keys() & theirs.keys())
        if not keys:
            raise KeyError((versus, budget))
        diff = np.array([mine[k] - theirs[k] for k in keys])
        draws = np.random.default_rng(seed).integers(0, len(diff), size=(rounds, len(diff)))
        means = diff[draws].mean(axis=1)
        tail = (1.0 - level) / 2
        return float(np.quantile(means, tail)), float(np.quantile(means, 1.0 - tail))

    def per_conversation(self, system: str, budget: int) -> dict[str, float]:
        """Mean evidence recall per conversation (the spread a held-out set will show too)."""
        by: dict[str, list[float]] = {}
        for (conversation, _), recall in self._by_question(system, budget).items():
            by.setdefault(conversation, []).append(recall)
        return {c: float(np.mean(v)) for c, v in sorted(by.items())}

    def _by_question(self, system: str, budget: int) -> dict[tuple[str, int], float]:
        """``system``'s evidence recall at ``budget`` per (conversation, question index)."""
        return {(r.conversation, r.question): r.recall for r in self.results
                if r.system == system and r.budget == budget}

    def mean_full_context_tokens(self) -> float:
        vals = list(self.full_context_tokens.values())
        return sum(vals) / len(vals) if vals else 0.0


def machine_description() -> str:
    """CPU model, core count and Python version, for reports."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import os

    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def code_version() -> str:
    """arbormem's version, plus the git commit (and "+dirty") when run from a checkout."""
    import subprocess
    from importlib.metadata import PackageNotFoundError, version
    from pathlib import Path

    try:
        out = version("arbormem")
    except PackageNotFoundError:
        out = "unknown"
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "."],
                               cwd=here.parent, capture_output=True, text=True, timeout=5,
                               check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return out
    return f"{out} (git {sha}{'+dirty' if dirty else ''})" if sha else out


def ingest_conversation(mem: Memory, conv: Conversation, user_id: str) -> list[Unit]:
    """Write a conversation into ``mem`` as exchanges through the public bulk API."""
    units = conv.units()
    items = [
        {
            "messages": u.messages(),
            "session_id": f"{conv.id}-s{u.session}",
            "at": u.at,
            "metadata": {
                "source": "locomo",
                "conversation": conv.id,
                "session": u.session,
                "dia_ids": list(u.dia_ids),
            },
        }
        for u in units
    ]
    mem.add_many(items, user_id=user_id)
    return units


def _aggregate(results: Sequence[QuestionResult], systems: Sequence[str], budgets: Sequence[int]) -> list[Score]:
    scores: list[Score] = []
    for system in systems:
        for budget in budgets:
            mine = [r for r in results if r.system == system and r.budget == budget]
            for category in (None, *SCORED_CATEGORIES):
                rs = [r for r in mine if category is None or r.category == category]
                if not rs:
                    continue
                scores.append(
                    Score(
                        system=system,
                        budget=budget,
                        category=category,
                        questions=len(rs),
                        evidence_recall=float(np.mean([r.recall for r in rs])),
                        recall_all=float(np.mean([r.found == r.evidence for r in rs])),
                        mean_tokens=float(np.mean([r.tokens for r in rs])),
                        over_budget=sum(1 for r in rs if r.tokens > budget),
                    )
                )
    return scores


# Long: the evaluation protocol in order (ingest, ask, score, baselines), one step each.
def run_locomo(
    mem: Memory,
    conversations: Sequence[Conversation],
    *,
    budgets: Sequence[int] = DEFAULT_BUDGETS,
    files: Sequence[str] = (),
    progress: bool = False,
    log: Callable[[str], None] | None = None,
) -> LocomoReport:
    """Ingest each conversation into ``mem`` and score arbormem and the baselines.

    ``mem`` should be empty for the users ``locomo-<id>``; they are deleted before ingest so a
    reused database file gives the same result.
    """
    from tqdm import tqdm

    t_start = time.perf_counter()
    budgets = tuple(sorted(set(int(b) for b in budgets)))
    embedder = mem.embedder
    results: list[QuestionResult] = []
    full_context: dict[str, int] = {}
    mismatches = 0
    latencies: list[float] = []
    ingest_s = 0.0
    n_units = 0
    total_q = sum(len(c.scored_questions()) for c in conversations)
    bar = tqdm(total=total_q, desc="questions", unit="q", disable=not progress, leave=False)
    for conv in conversations:
        user_id = f"locomo-{conv.id}"
        mem.delete_user(user_id)
        t0 = time.perf_counter()
        units = ingest_conversation(mem, conv, user_id)
        ingest_s += time.perf_counter() - t0
        n_units += len(units)
        if log:
            log(f"conversation {conv.id}: {len(units)} exchanges ingested in {time.perf_counter() - t0:.1f}s")

        blocks = [render_unit(u) for u in units]
        block_tokens = [count_tokens(b) for b in blocks]
        full_context[conv.id] = count_tokens("\n\n".join(blocks))
        flat = FlatIndex([u.text() for u in units], embedder.embed([u.text() for u in units]))
        questions: list[tuple[int, Question]] = [
            (i, q) for i, q in enumerate(conv.questions) if q.category in SCORED_CATEGORIES
        ]
        qvecs = embedder.embed([q.question for _, q in questions])
        for (qi, q), qvec in zip(questions, qvecs, strict=True):
            ev_texts = [conv.turn_index[e].text for e in q.evidence]
            rankings = flat.rankings(q.question, qvec)
            for budget in budgets:
                t0 = time.perf_counter()
                r = mem.recall(q.question, user_id=user_id, max_tokens=budget)
                latencies.append((time.perf_counter() - t0) * 1000)
                for system, rr in ((ARBORMEM, r),
                                   (ARBORMEM_NOFLOOR, mem.recall(q.question, user_id=user_id, max_tokens=budget,
                                                                 min_relevance=0))):
                    tokens = count_tokens(rr.text)
                    if tokens != rr.tokens:
                        mismatches += 1
                    results.append(
                        QuestionResult(conv.id, qi, q.category, system, budget,
                                       evidence_found(rr.text, ev_texts), len(ev_texts), tokens)
                    )
                for system in BASELINES:
                    p = pack(rankings[system], blocks, block_tokens, budget, count_tokens)
                    results.append(
                        QuestionResult(conv.id, qi, q.category, system, budget,
                                       evidence_found(p.text, ev_texts), len(ev_texts), p.tokens)
                    )
            bar.update(1)
    bar.close()
    nulls = null_check(mem, conversations, log=log)
    lat = np.array(latencies) if latencies else np.zeros(1)
    return LocomoReport(
        files=tuple(str(f) for f in files),
        budgets=budgets,
        systems=SYSTEMS,
        embedder=getattr(embedder, "name", type(embedder).__name__),
        conversations=len(conversations),
        turns=sum(len(c.turns) for c in conversations),
        exchanges=n_units,
        questions=total_q,
        skipped_questions=sum(c.skipped_questions for c in conversations),
        full_context_tokens=full_context,
        scores=tuple(_aggregate(results, SYSTEMS, budgets)),
        token_mismatches=mismatches,
        recall_ms={
            "mean": float(lat.mean()),
            "p50": float(np.percentile(lat, 50)),
            "p95": float(np.percentile(lat, 95)),
        },
        ingest_seconds=ingest_s,
        seconds=time.perf_counter() - t_start,
        machine=machine_description(),
        date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        version=code_version(),
        results=tuple(results),
        store=type(mem.store).__name__.removesuffix("Store").lower(),
        null_check=tuple(nulls),
        min_relevance=float(mem.settings.recall.min_relevance if mem.settings.recall.min_relevance is not None
                            else mem.embedder.relevance_floor or 0.0),
    )


def null_check(mem: Memory, conversations: Sequence[Conversation], budgets: Sequence[int] = NULL_BUDGETS,
               log: Callable[[str], None] | None = None) -> list[NullScore]:
    """Each conversation's memory (already ingested as ``locomo-<id>``) asked every other
    conversation's scored questions: nothing in it answers them. Reports, floor on and off,
    the share answered with at most ``NULL_SHARE`` of the budget (the recent window and the
    frame fit in it; a packed exchange or two more may) and the share of searches with no hit."""
    pairs = [(c, o) for c in conversations for o in conversations if o.id != c.id]
    if not pairs:
        return []
    quiet: dict[tuple[int, bool], list[int]] = {(b, f): [] for b in budgets for f in (True, False)}
    empty: dict[bool, list[int]] = {True: [], False: []}
    for conv, other in pairs:
        user_id = f"locomo-{conv.id}"
        for q in other.scored_questions():
            for floor in (True, False):
                extra = {} if floor else {"min_relevance": 0}
                empty[floor].append(0 if mem.search(q.question, user_id=user_id, **extra) else 1)  # type: ignore[arg-type]
                for b in budgets:
                    quiet[(b, floor)].append(count_tokens(
                        mem.recall(q.question, user_id=user_id, max_tokens=b, **extra).text))  # type: ignore[arg-type]
        if log:
            log(f"null check: memory {conv.id} asked the questions of {other.id}")
    return [NullScore(budget=b, floor=f, questions=len(toks),
                      quiet_share=float(np.mean([t <= NULL_SHARE * b for t in toks])),
                      mean_tokens=float(np.mean(toks)), search_empty_share=float(np.mean(empty[f])))
            for (b, f), toks in quiet.items()]


__all__ = [
    "DEFAULT_BUDGETS",
    "SYSTEMS",
    "SYSTEM_LABELS",
    "CATEGORIES",
    "LocomoReport",
    "NullScore",
    "null_check",
    "QuestionResult",
    "Score",
    "count_tokens",
    "evidence_found",
    "run_locomo",
]
