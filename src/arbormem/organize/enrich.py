"""LLM enrichment of the topic tree, run by the organiser — never on the write path.

``complete()`` places an exchange with embeddings and offline labels only. Later, ``organize``
asks the LLM to label and summarise *frozen* topics (the conversation has moved on, so the
topic will not change under the label): title, keywords, retrieval terms, trigger, summary.

Failure behaviour, the property the seeds lacked: a topic's stored labels change only when
the LLM returned a validated ``TopicLabel``. On any failure the topic keeps exactly its
offline labels (nothing is written, not even a marker), the failure is in the runner's log,
and the topic is tried again on a later run. Topics are labelled a few per call (``batch``),
and after ``max_failures`` failed calls in a row a run stops early, so a dead endpoint costs
a few calls per run, not one per topic.

The LLM is called outside any store transaction (a slow model must not block writers); the
label is written in a short transaction afterwards, and only if the topic did not change in
the meantime.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config import TreeSettings
from ..llm.prompts import Budget, TopicCard, Turn
from ..llm.roles import (
    detail_topic,
    label_topics,
)
from ..llm.runner import LLMRunner
from ..models import Exchange
from ..store.base import Store, TopicRecord
from .title_vectors import PhraseVectors
from .tree import TreeSession

if TYPE_CHECKING:
    from .segment import SegmentReport

@dataclass(frozen=True)
class EnrichReport:
    """What one ``organize`` run did. ``llm_calls`` counts calls made by this run."""

    user_id: str
    candidates: int
    labelled: int
    failed: int
    skipped: int
    llm_calls: int
    stopped_early: bool = False
    #: Why the run stopped before its last topic (time budget spent, endpoint down), if it did.
    stop_reason: str | None = None
    #: The tail re-segmentation run first, when asked for (``organize(..., segment=True)``).
    segmented: SegmentReport | None = None

    def to_dict(self) -> dict[str, object]:
        out = dict(self.__dict__)
        out["segmented"] = dict(self.segmented.__dict__) if self.segmented is not None else None
        return out


def to_turns(exchanges: Iterable[Exchange]) -> list[Turn]:
    """Completed, non-archived exchanges as role input."""
    return [
        Turn(e.seq, e.user_text, e.assistant_text, e.user_at)
        for e in exchanges
        if e.status == "completed" and not e.archived
    ]


def to_card(rec: TopicRecord, path: Sequence[str] = ()) -> TopicCard:
    return TopicCard(
        id=rec.id, title=rec.title, keywords=tuple(rec.keywords), summary=rec.summary,
        first_at=rec.first_at, last_at=rec.last_at, size=rec.size, path=tuple(path),
    )


def needs_label(rec: TopicRecord, min_size: int = 1) -> bool:
    """A frozen leaf whose labels are offline, or were made when it had another size."""
    if rec.kind != "topic" or not rec.frozen or rec.size < min_size:
        return False
    return not (rec.meta.label_source == "llm" and rec.meta.label_size == rec.size)


# Long: the run loop with its stop rules (budget, consecutive failures, breaker) and the
# per-batch bookkeeping they share, in one place so the stop reason is the one reported.
def organize_labels(
    store: Store,
    runner: LLMRunner,
    user_id: str,
    settings: TreeSettings,
    *,
    limit: int = 50,
    batch: int = 4,
    min_size: int = 1,
    max_failures: int = 3,
    deadline: float | None = None,
    phrases: PhraseVectors | None = None,
) -> EnrichReport:
    """Label up to ``limit`` frozen topics of a user through the LLM (newest first).

    Topics go ``batch`` to a call (``label_topics``), so the organiser costs about
    topics / batch calls; each validated label rewrites one topic's title, keywords and
    summary (plus retrieval terms and trigger in its metadata and index text).
    An invalid answer costs only its batch: the run goes on to older topics (the server is
    up), and the runner will not send that batch's prompt again for a while, so the next run
    moves on too. ``max_failures`` timeouts or endpoint errors in a row, an open breaker, or
    ``deadline`` (``time.monotonic()``; the run's time budget) stop the run.
    """
    budget = Budget()
    todo = [r for r in store.list_topics(user_id) if needs_label(r, min_size)]
    todo.sort(key=lambda r: -(r.end_seq or 0))  # recent topics are the likeliest recalled
    picked = todo[:limit]
    calls_before = runner.total_calls
    labelled = failed = skipped = streak = 0
    stopped = False
    why: str | None = None
    for start in range(0, len(picked), max(1, batch)):
        group: list[tuple[TopicRecord, list[Turn]]] = []
        for rec in picked[start : start + max(1, batch)]:
            turns = to_turns(store.list_exchanges(user_id, topic_id=rec.id, status="completed"))
            if turns:
                group.append((rec, turns))
            else:
                skipped += 1
        if not group:
            continue
        if deadline is not None and time.monotonic() >= deadline:
            skipped += len(group)
            stopped, why = True, "the run's time budget is spent"
            break
        result = label_topics(runner, [(rec.id, turns) for rec, turns in group], budget, deadline=deadline)
        if result is None:
            call = runner.last_call()
            if call is not None and call.skip == "repeat":
                skipped += len(group)  # this very prompt failed recently: next batch
                continue
            if call is not None and call.skip is not None:
                skipped += len(group)
                stopped, why = True, call.error
                break
            failed += len(group)
            if call is not None and call.outcome == "invalid":
                continue  # a bad answer: the server works, older topics may fare better
            streak += 1
            if streak >= max_failures:
                stopped, why = True, f"{streak} calls in a row timed out or failed"
                break
            continue
        streak = 0
        failed += sum(1 for rec, _ in group if rec.id not in result.labels)
        with store.transaction(user_id):
            tree = TreeSession(store, user_id, settings, phrases=phrases)
            for rec, _ in group:
                label = result.labels.get(rec.id)
                if label is None:
                    continue
                ok = tree.set_label(
                    rec.id,
                    expect_size=rec.size,
                    expect_end=rec.end_seq,
                    title=label.title,
                    keywords=list(label.keywords),
                    summary=label.summary,
                    retrieval_terms=list(label.retrieval_terms),
                    trigger=label.trigger or "",
                )
                if not ok:
                    skipped += 1  # the topic changed while the model was thinking
                    continue
                labelled += 1
                store.log_change(user_id, "label", rec.id, {"source": "llm", "model": runner.name, "title": label.title})
            tree.flush()
    return EnrichReport(
        user_id=user_id, candidates=len(todo), labelled=labelled, failed=failed, skipped=skipped,
        llm_calls=runner.total_calls - calls_before, stopped_early=stopped, stop_reason=why,
    )


def topic_detail(store: Store, runner: LLMRunner | None, rec: TopicRecord) -> str | None:
    """The depth-1 detailed summary of a topic (CoMeT): made on first request, then cached.

    Cached in the topic's metadata with the topic's size, so it is remade only after the
    topic changed. None when there is no LLM or the call failed (nothing is cached then).
    """
    if rec.kind != "topic":
        return None
    cached = rec.meta.detail
    if cached and rec.meta.detail_size == rec.size:
        return cached
    if runner is None:
        return None
    turns = to_turns(store.list_exchanges(rec.user_id, topic_id=rec.id, status="completed"))
    result = detail_topic(runner, rec.title, turns)
    if result is None:
        return None
    with store.transaction(rec.user_id):
        cur = store.get_topic(rec.id)
        if cur is not None and cur.size == rec.size:
            cur.meta.detail, cur.meta.detail_size = result.detail, cur.size
            store.put_topic(cur)
    return result.detail


__all__ = [
    "EnrichReport",
    "organize_labels",
    "needs_label",
    "topic_detail",
    "to_turns",
    "to_card",
]
