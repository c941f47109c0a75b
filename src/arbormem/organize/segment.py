"""LLM re-segmentation of the open tail (Topic Memory's topic worker, made incremental).

Offline placement decides each exchange's topic the moment it completes. When an LLM is
configured, ``Memory.organize(..., segment=True)`` lets it revise that for the *recent* tail:

* only exchanges after ``root.meta.segmented_through`` are sent, at most ``window`` of
  them, and only once ``min_new`` have arrived, so the prompt never grows with history;
* the answer is validated all-or-nothing (``llm.roles.check_segmentation``): spans cover the
  tail exactly, ``finalized`` only with enough exchanges after it;
* spans are mapped to the tail's existing topics by overlap (``stable_assignment``), so
  topic ids stay stable; only exchanges whose topic differs are moved;
* a span that needs a new topic asks the router (TRACE's classifier) which of the tail's
  bottom-level themes it belongs under;
* ``finalized`` spans are frozen and never sent again (``segmented_through`` advances past
  them); ``open``/``provisional`` ones are revisited next run;
* the LLM is called with no lock held; the moves happen in one transaction, and are skipped
  if the tail changed meanwhile. Any failure leaves the tree exactly as placement made it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import TreeSettings
from ..llm import roles
from ..llm.runner import LLMRunner
from ..models import Exchange
from ..store.base import Store, TopicRecord
from ..text import term_counts
from .enrich import to_card, to_turns
from .title_vectors import PhraseVectors
from .tree import TreeSession


@dataclass(frozen=True)
class SegmentReport:
    """What one re-segmentation run did."""

    user_id: str
    tail: int
    spans: int
    moved: int
    created: int
    finalized_through: int
    llm_calls: int
    applied: bool


def segment_tail(store: Store, runner: LLMRunner, user_id: str, settings: TreeSettings, *,
                 window: int = 24, min_new: int = 6, min_follow: int = 4,
                 deadline: float | None = None, phrases: PhraseVectors | None = None) -> SegmentReport:
    """Let the LLM re-segment the user's open tail; see the module docstring. ``deadline``
    (``time.monotonic()``) bounds its LLM calls (the organize run's budget)."""
    calls0 = runner.total_calls
    roots = store.list_topics(user_id, parent_id=None)
    through = roots[0].meta.segmented_through if roots else 0
    tail = [e for e in store.list_exchanges(user_id, status="completed", after_seq=through, limit=window)
            if not e.archived]

    def report(spans: int = 0, moved: int = 0, created: int = 0, done: int = through,
               applied: bool = False) -> SegmentReport:
        return SegmentReport(user_id, len(tail), spans, moved, created, done,
                             runner.total_calls - calls0, applied)

    if len(tail) < min_new:
        return report()
    seg = roles.segment(runner, to_turns(tail), max_turns=window, min_follow=min_follow, deadline=deadline)
    if seg is None:  # failure recorded in the runner's log; placement stands
        return report()
    # Mapped once: the transaction below goes ahead only if the tail's topics are unchanged.
    assignment = roles.stable_assignment(seg, _tail_spans(tail))
    routes = _route_new_spans(store, runner, user_id, tail, [s for t, s in assignment if t is None], deadline)
    with store.transaction(user_id):
        fresh = {e.seq: e for e in store.exchanges_by_seq(user_id, [e.seq for e in tail])}
        if any(fresh.get(e.seq) is None or fresh[e.seq].topic_id != e.topic_id for e in tail):
            return report(spans=len(seg.topics))  # the tail changed while the model thought
        tree = TreeSession(store, user_id, settings, phrases=phrases)
        vecs = store.get_vectors(user_id, "exchange", [e.id for e in tail])
        moved = created = 0
        done = through
        last_target = None
        for topic_id, span in assignment:
            members = [e for e in tail if span.start_seq <= e.seq <= span.end_seq]
            if not members:
                continue
            target = tree.get(topic_id) if topic_id else None
            if target is None:
                parent_id = routes.get(span.start_seq)
                target = tree.new_leaf_beside(members[0].topic_id, members[0].seq, under=parent_id)
                created += 1
            for e in members:
                if e.topic_id != target.id:
                    tree.move(e, vecs.get(e.id), term_counts(e.text), target)
                    moved += 1
            target.meta.segment_status = span.status
            if span.status == "finalized":
                tree.freeze(target)
                done = max(done, span.end_seq)
            else:  # the model says the conversation may still come back to it
                target.frozen = False
                tree.touch(target)
            last_target = target
        if last_target is not None and not last_target.frozen:
            tree.root.meta.current = last_target.id
        tree.root.meta.segmented_through = done
        tree.touch(tree.root)
        tree.flush()
        if moved or created:
            store.log_change(user_id, "segment", tree.root.id, {
                "spans": [(s.start_seq, s.end_seq, s.status) for s in seg.topics],
                "moved": moved, "created": created, "through": done,
            })
    return report(len(seg.topics), moved, created, done, True)


def _tail_spans(tail: list[Exchange]) -> list[tuple[str, int, int]]:
    """(topic id, first seq, last seq) of each topic among the tail's exchanges."""
    spans: dict[str, tuple[int, int]] = {}
    for e in tail:
        if e.topic_id:
            lo, hi = spans.get(e.topic_id, (e.seq, e.seq))
            spans[e.topic_id] = (min(lo, e.seq), max(hi, e.seq))
    return [(t, lo, hi) for t, (lo, hi) in spans.items()]


def _route_new_spans(store: Store, runner: LLMRunner, user_id: str, tail: list[Exchange],
                     pending: list[roles.Segment], deadline: float | None = None) -> dict[int, str]:
    """Ask the router (TRACE's classifier) where each span that needs a new topic belongs.

    Runs before the write transaction (no lock held during LLM calls). The choices are the
    bottom-level themes that hold the tail's topics, so a new topic keeps the tree balanced
    (every topic at the same depth). Returns {span start: chosen theme id}; a span the router
    could not place (or any failure) gets the theme of the topic it starts beside.
    """
    if not pending:
        return {}
    themes: list[TopicRecord] = []
    for e in reversed(tail):
        leaf = store.get_topic(e.topic_id) if e.topic_id else None
        parent = store.get_topic(leaf.parent_id) if leaf is not None and leaf.parent_id else None
        if parent is not None and parent.kind == "theme" and all(t.id != parent.id for t in themes):
            themes.append(parent)
        if len(themes) >= 4:
            break
    if not themes:
        return {}
    cards = [to_card(t) for t in themes]
    by_seq = {e.seq: e for e in tail}
    out: dict[int, str] = {}
    for span in pending:
        first = by_seq.get(span.start_seq)
        if first is None:
            continue
        before = [e for e in tail if e.seq < span.start_seq][-6:]
        prev = store.get_topic(before[-1].topic_id) if before and before[-1].topic_id else None
        decision = roles.route(runner, to_card(prev) if prev is not None else None, cards,
                               to_turns(before), to_turns([first])[0], deadline=deadline)
        if decision is not None and not decision.continue_current and decision.parent_index is not None:
            out[span.start_seq] = cards[decision.parent_index].id
    return out
