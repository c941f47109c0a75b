"""What consolidation's state changes in a recall (used by ``retrieve/engine.py``): updates
outrank the facts they superseded, linked topics get a small share of a strong topic's
relevance, and pinned (passive/both) topics' latest exchanges come first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..models import Exchange
from ..store.base import Store
from ..store.state import ExchangeMarks


def rerank_superseded(store: Store, user_id: str, scores: dict[str, float],
                      exchanges: dict[str, Exchange], demote: float = 0.8) -> list[str]:
    """Prefer updates over the facts they superseded, keeping both.

    For every candidate exchange that a newer one superseded: the newer one joins the
    candidates (loaded into ``exchanges``) with at least the older one's score, and the older
    one is demoted (``demote``x) but not dropped, so it can still be shown, marked. Returns the
    ids that joined.
    """
    want = {sb: eid for eid in list(scores) if (ex := exchanges.get(eid)) is not None
            and (sb := ExchangeMarks.of(ex.metadata).superseded_by) is not None}
    if not want:
        return []
    joined = []
    for newer in store.get_exchanges(user_id, list(want)):
        if newer.status != "completed" or newer.archived:
            continue
        old_score = scores[want[newer.id]]
        if newer.id not in scores:
            joined.append(newer.id)
        exchanges.setdefault(newer.id, newer)
        scores[newer.id] = max(scores.get(newer.id, 0.0), old_score * 1.05)
        scores[want[newer.id]] = old_score * demote
    return joined


#: How much of a topic's relevance its linked topics get in recall. On the LoCoMo development
#: files (no LLM, 140 links) 0.5 and 0.25 each lost two questions at 2,048 tokens (linked
#: topics' turns displaced evidence), 0.2, 0.15, 0.1 and 0.05 lost none and gained none; 0.1
#: keeps a margin below where it starts to cost. A link is a weak hint, not relevance.
LINK_WEIGHT = 0.1


def linked_topics(store: Store, user_id: str, topic_scores: Mapping[str, float], top: int = 3,
                  weight: float = LINK_WEIGHT) -> dict[str, float]:
    """Topics linked to the ``top`` strongest ones, scored ``weight`` x the linking topic's
    score (for recall to follow cross-links; the packer's budget still bounds what is shown).
    Reads the links of ``top`` topics (one query)."""
    out: dict[str, float] = {}
    strongest = sorted(topic_scores.items(), key=lambda kv: -kv[1])[:top]
    links = store.topic_links(user_id, [tid for tid, _ in strongest]) if strongest else {}
    for tid, s in strongest:
        for other in links.get(tid, ()):
            if other not in topic_scores:
                out[other] = max(out.get(other, 0.0), weight * s)
    return out


#: Most of a recall's budget that pinned (passive/both) topics may take.
PASSIVE_SHARE = 0.25


def pinned_exchanges(store: Store, user_id: str, cost: Callable[[Exchange], int], budget: int) -> list[Exchange]:
    """The latest exchanges of the user's pinned topics whose ``cost`` (tokens) fits in
    ``budget``, newest first per topic, topics taking turns so each pinned topic shows."""
    per_topic = []
    for tid in passive_topics(store, user_id):
        exs = [e for e in store.list_exchanges(user_id, topic_id=tid, status="completed") if not e.archived]
        per_topic.append(list(reversed(exs)))
    out: list[Exchange] = []
    used = 0
    for rank in range(max((len(x) for x in per_topic), default=0)):
        for exs in per_topic:
            if rank < len(exs):
                c = cost(exs[rank])
                if used + c <= budget:
                    out.append(exs[rank])
                    used += c
    return out


def recall_marks(store: Store, user_id: str, scores: dict[str, float], exchanges: dict[str, Exchange],
                 budget: int, cost: Callable[[Exchange], int]) -> dict[str, str]:
    """The recall hook (retrieve/engine.py): apply ``rerank_superseded``, then put the pinned
    topics' latest exchanges (within ``PASSIVE_SHARE`` of ``budget``) above every other
    candidate. Updates ``scores``/``exchanges`` in place; returns {joined id: source}."""
    joined = dict.fromkeys(rerank_superseded(store, user_id, scores, exchanges), "update")
    pinned = pinned_exchanges(store, user_id, cost, int(budget * PASSIVE_SHARE))
    top = max(scores.values(), default=1.0)
    for ex in pinned:
        exchanges.setdefault(ex.id, ex)
        scores[ex.id] = max(scores.get(ex.id, 0.0), 2.0 * abs(top) + 1.0)
        joined[ex.id] = "pinned"
    return joined


def passive_topics(store: Store, user_id: str) -> list[str]:
    """Ids of the user's topics whose recall mode is ``passive`` or ``both`` (kept in the root's
    meta so recall reads one row, not every topic)."""
    roots = store.list_topics(user_id, parent_id=None)
    return list(roots[0].meta.passive) if roots else []


__all__ = ["LINK_WEIGHT", "PASSIVE_SHARE", "linked_topics", "passive_topics", "pinned_exchanges",
           "recall_marks", "rerank_superseded"]
