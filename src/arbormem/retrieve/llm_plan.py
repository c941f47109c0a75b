"""The optional LLM step of recall: ONE call that analyses the query and selects topics.

CoMeT analyses the query with one LLM call and Topic Memory selects topics with another, over
a directory of every topic. Here both are one prompt (``plan_recall``), over a directory of at
most ``max_directory`` topics that the offline hybrid search already ranked, so the prompt
does not grow with the history and a recall costs at most one LLM call.

The plan only *adds evidence* to the offline ranking — it lifts the selected topics and the
exchanges in its time range, and adds lexical hits for its rewritten query. It never removes
a candidate: a wrong plan costs some ranking quality, not the answer. When the call fails, the
offline ranking is used unchanged and ``recall().trace.notes`` says so.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from datetime import datetime, time, timedelta, timezone
from time import monotonic
from typing import TYPE_CHECKING

from pydantic import Field

from ..llm.prompts import Budget, TopicCard, Turn, plan_messages
from ..llm.roles import Intent, QueryPlan, check_time_range, handles, resolve_handles
from ..llm.runner import LLMRunner
from ..models import Exchange
from ..store.base import ExchangeHead
from ..text import terms

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Retriever
    from .scoring import Candidate


class _PlanSchema(QueryPlan):
    needs_memory: bool = True
    topic_ids: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class RecallPlan:
    """A validated plan. ``time_range`` is a half-open [start, end) window in ``now``'s zone."""

    semantic_query: str
    intent: Intent
    time_range: tuple[datetime, datetime] | None
    needs_memory: bool
    topic_ids: tuple[str, ...]


def plan_recall(
    runner: LLMRunner,
    query: str,
    now: datetime | None,
    directory: Sequence[TopicCard],
    recent: Sequence[Turn] = (),
    *,
    limit: int = 3,
    max_directory: int = 20,
    budget: Budget | None = None,
    deadline: float | None = None,
) -> RecallPlan | None:
    """Semantic query, intent, time range and up to ``limit`` topic ids — or None (also when
    ``deadline``, a ``time.monotonic()`` value, passes first)."""
    if not query.strip():
        return None
    ref = now or datetime.now(timezone.utc)
    table = handles(list(directory)[:max_directory])
    msgs = plan_messages(query, ref, list(recent)[-3:], table, budget or Budget(), limit=limit)

    def check(p: _PlanSchema) -> _PlanSchema:
        check_time_range(p.time_range, ref)
        return p.model_copy(update={"topic_ids": resolve_handles(p.topic_ids, table, limit)})

    plan = runner.run("planner", msgs, _PlanSchema, check=check, deadline=deadline)
    if plan is None:
        return None
    rng = None
    if plan.time_range is not None:
        tz = ref.tzinfo or timezone.utc
        try:
            start = datetime.combine(plan.time_range.start, time.min, tzinfo=tz)
            end = datetime.combine(plan.time_range.end, time.min, tzinfo=tz) + timedelta(days=1)
            rng = (start, end)
        except (OverflowError, ValueError):  # a range ending on 9999-12-31: no window
            rng = None
    return RecallPlan(
        semantic_query=plan.semantic_query, intent=plan.intent, time_range=rng,
        needs_memory=plan.needs_memory, topic_ids=tuple(plan.topic_ids),
    )


class RecallPlanner:
    """What ``Retriever.recall`` calls between candidate scoring and packing (one LLM call)."""

    def __init__(self, runner: LLMRunner, *, limit: int = 3, max_directory: int = 20,
                 deadline: float | None = None) -> None:
        """``deadline``: seconds the whole LLM step of one recall may take (every call it
        makes, with retries); None waits for the LLM's own timeouts."""
        self.runner = runner
        self.limit = limit
        self.max_directory = max_directory
        self.deadline = deadline

    def apply(
        self,
        retriever: Retriever,
        user_id: str,
        query: str,
        now: datetime | None,
        cands: MutableMapping[str, Candidate],
        topic_norm: Mapping[str, float],
        exchanges: MutableMapping[str, Exchange | ExchangeHead],
        offline_range: tuple[datetime, datetime] | None,
    ) -> list[str]:
        """Plan, then lift the candidates the plan points at. Returns notes for the trace."""
        from . import scoring as sc
        from .scoring import RRF_K, Candidate, rrf

        until = None if self.deadline is None else monotonic() + self.deadline
        store = retriever.store
        directory = self._directory(retriever, user_id, cands, topic_norm, exchanges)
        if not directory and not cands:
            return []  # an empty memory: nothing a plan could point at, so no call
        recent = store.list_exchanges(user_id, status="completed", limit=3, newest_first=True)
        turns = [Turn(e.seq, e.user_text, e.assistant_text, e.user_at) for e in reversed(recent)]
        plan = plan_recall(self.runner, query, now, directory, turns,
                           limit=self.limit, max_directory=self.max_directory, deadline=until)
        if plan is None:
            last = self.runner.log(role="planner")
            why = (last[-1].error or "failed") if last else "failed"
            return [f"llm plan failed, offline ranking used: {why[:160]}"]

        top = max((c.score for c in cands.values()), default=1.0 / RRF_K)
        qvec = None
        # Selected topics: their best exchanges join (by similarity to the query) and every
        # candidate inside them is lifted, the first choice most.
        for rank, tid in enumerate(plan.topic_ids):
            lift = 1.0 - sc.PLAN_RANK_STEP * rank
            members = [e for e in store.list_exchanges(user_id, topic_id=tid, status="completed") if not e.archived]
            for e in members[:64]:
                exchanges.setdefault(e.id, e)
            in_topic = [c for c in cands.values() if exchanges.get(c.ex_id) and exchanges[c.ex_id].topic_id == tid]
            # Lifts are relative to the best offline score, so they work on any score scale.
            for c in in_topic:
                c.score = max(c.score * (1.0 + sc.PLAN_TOPIC_MUL * lift), top * (1.0 + sc.PLAN_TOPIC_TOP * lift))
                c.sources.add("llm-topic")
            if not in_topic and members:
                if qvec is None:
                    qvec = retriever.embedder.embed_one(plan.semantic_query)
                vecs = store.get_vectors(user_id, "exchange", [e.id for e in members[:64]])
                best = sorted((e for e in members[:64] if e.id in vecs), key=lambda e: -float(vecs[e.id] @ qvec))[:2]
                for j, e in enumerate(best):
                    c = cands.setdefault(e.id, Candidate(e.id))
                    c.score = max(c.score, top * (1.0 + sc.PLAN_TOPIC_TOP * lift) * (1.0 - sc.PLAN_JOIN_STEP * j))
                    c.sources.add("llm-topic")
        # The rewritten query adds lexical evidence the literal one lacked (resolved pronouns,
        # synonyms, another language's words).
        extra = [t for t in terms(plan.semantic_query) if t not in set(terms(query))]
        if extra:
            ranked = store.text_search(user_id, "exchange", extra, 20)
            fresh = [i for i, _ in ranked if i not in exchanges]
            for e in store.get_exchanges(user_id, fresh):
                exchanges[e.id] = e
            for ex_id, s in rrf(ranked, sc.PLAN_LEXICAL_RRF).items():
                if ex_id in exchanges and exchanges[ex_id].status == "completed" and not exchanges[ex_id].archived:
                    c = cands.setdefault(ex_id, Candidate(ex_id))
                    c.score += s
                    c.sources.add("llm-lexical")
        # A time window the offline parser missed (other languages, vaguer phrasings).
        if plan.time_range is not None and offline_range is None:
            start, end = plan.time_range
            for c in cands.values():
                hit = exchanges.get(c.ex_id)
                if hit is not None and _in(hit.user_at, start, end):
                    c.score = max(c.score * sc.PLAN_TIME_MUL, top * sc.PLAN_TIME_TOP)
                    c.sources.add("llm-time")
        span = f"{plan.time_range[0].date()}..{(plan.time_range[1] - timedelta(days=1)).date()}" if plan.time_range else "none"
        return [f"llm plan: intent={plan.intent}, topics={len(plan.topic_ids)}, time={span}, "
                f"query={plan.semantic_query[:80]!r}"]

    def _directory(
        self,
        retriever: Retriever,
        user_id: str,
        cands: Mapping[str, Candidate],
        topic_norm: Mapping[str, float],
        exchanges: Mapping[str, Exchange | ExchangeHead],
    ) -> list[TopicCard]:
        """Leaf topics ranked by the offline search: topic hits first, then the topics of the
        best exchange hits. Bounded by ``max_directory`` whatever the history size."""
        order: list[str] = [t for t, _ in sorted(topic_norm.items(), key=lambda kv: -kv[1])]
        for c in sorted(cands.values(), key=lambda c: -c.score):
            tid = exchanges[c.ex_id].topic_id if c.ex_id in exchanges else None
            if tid:
                order.append(tid)
        cards: list[TopicCard] = []
        seen: set[str] = set()
        for tid in order:
            if tid in seen:
                continue
            seen.add(tid)
            rec = retriever.store.get_topic(tid)
            if rec is None or rec.user_id != user_id or rec.kind != "topic":
                continue
            cards.append(TopicCard(id=rec.id, title=rec.title, keywords=tuple(rec.keywords), summary=rec.summary,
                                   first_at=rec.first_at, last_at=rec.last_at, size=rec.size))
            if len(cards) >= self.max_directory:
                break
        return cards


def _in(at: datetime, start: datetime, end: datetime) -> bool:
    try:
        return start <= at < end
    except TypeError:  # naive vs aware: compare as UTC
        def aware(d: datetime) -> datetime:
            return d if d.tzinfo else d.replace(tzinfo=timezone.utc)

        return aware(start) <= aware(at) < aware(end)


__all__ = ["RecallPlan", "RecallPlanner", "plan_recall"]
