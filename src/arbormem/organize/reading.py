"""Reading topics at three depths, recall modes, the change history and undo (behind ``Memory``).

Tiers (CoMeT): 0 = title and short summary; 1 = a detailed summary, made by the LLM when one
is configured (``enrich.topic_detail``) and otherwise extractive, cached in the topic's meta
until the topic changes size; 2 = the verbatim exchanges.

Recall modes (CoMeT): ``active`` topics are recalled when relevant (the default); ``passive``
and ``both`` topics are pinned: recall puts their latest exchanges in every context, within a
share of the budget. The pinned ids live in the root's meta, so recall reads one row.
"""

from __future__ import annotations

from typing import Any, get_args

from ..config import TreeSettings
from ..errors import NotFoundError, ValidationError
from ..models import Topic
from ..render import render_exchange
from ..store.base import ChangeRecord, Store, TopicRecord
from ..text import idf, sentences, shorten, terms
from .enrich import topic_detail
from .models import Change, RecallMode, TopicReading
from .title_vectors import PhraseVectors
from .tree import TreeSession
from .undo import find_change, mentions, undo_change

DETAIL_SENTENCES = 6


def extractive_detail(store: Store, rec: TopicRecord, limit: int = DETAIL_SENTENCES) -> str:
    """The topic's most keyword-rich sentences, in conversation order (no LLM)."""
    members = [e for e in store.list_exchanges(rec.user_id, topic_id=rec.id, status="completed") if not e.archived]
    df = store.get_term_df(rec.user_id, list(rec.keywords))
    n_docs = max(1, rec.size)
    weights = {t: idf(df.get(t, 1), max(n_docs, max(df.values(), default=1))) + 1.0 for t in rec.keywords}
    scored: list[tuple[float, int, str]] = []
    for e in members:
        for sent in sentences(e.user_text) + sentences(e.assistant_text):
            toks = set(terms(sent))
            score = sum(w for t, w in weights.items() if t in toks) / (1.0 + 0.01 * len(sent))
            if score > 0:
                scored.append((score, len(scored), sent))
    best = sorted(sorted(scored, key=lambda s: -s[0])[:limit], key=lambda s: s[1])
    return " ".join(shorten(s, 300) for _, _, s in best) or rec.summary


def read_topic(store: Store, llm: Any, rec: TopicRecord, view: Topic, depth: int) -> TopicReading:
    mode = rec.meta.recall_mode
    common: dict[str, Any] = {
        "topic": view, "depth": depth, "recall_mode": mode,
        "tags": tuple(rec.meta.tags), "links": tuple(rec.meta.links),
    }
    if depth == 0:
        return TopicReading(text=f"{rec.title}\n{rec.summary}".strip(), source="summary", **common)
    if depth == 1:
        if rec.kind == "topic" and llm is not None:
            detail = topic_detail(store, llm, rec)
            if detail:
                return TopicReading(text=detail, source="llm", **common)
        cached = rec.meta.detail_x
        if cached is not None and rec.meta.detail_x_size == rec.size:
            return TopicReading(text=cached, source="extractive", **common)
        text = extractive_detail(store, rec) if rec.kind == "topic" else rec.summary
        with store.transaction(rec.user_id):
            cur = store.get_topic(rec.id)
            if cur is not None and cur.size == rec.size:
                cur.meta.detail_x, cur.meta.detail_x_size = text, cur.size
                store.put_topic(cur)
        return TopicReading(text=text, source="extractive", **common)
    exchanges = tuple(e for e in store.list_exchanges(rec.user_id, topic_id=rec.id) if e.status == "completed")
    text = "\n".join(render_exchange(e) for e in exchanges)
    return TopicReading(text=text, source="verbatim", exchanges=exchanges, **common)


def set_recall_mode(store: Store, user_id: str, topic_id: str, mode: RecallMode, settings: TreeSettings,
                    phrases: PhraseVectors | None = None) -> None:
    if mode not in get_args(RecallMode):
        raise ValidationError(f"recall mode must be one of {get_args(RecallMode)}, not {mode!r}")
    with store.transaction(user_id):
        tree = TreeSession(store, user_id, settings, phrases=phrases)
        node = tree.get(topic_id) if isinstance(topic_id, str) else None
        if node is None or node.kind == "root":
            raise NotFoundError(f"no topic {topic_id!r}")
        old = node.meta.recall_mode
        node.meta.recall_mode = mode
        pinned = [t for t in tree.root.meta.passive if t != topic_id]
        if mode in ("passive", "both"):
            pinned.append(topic_id)
        tree.root.meta.passive = pinned
        tree.touch(node)
        tree.touch(tree.root)
        tree.flush()
        store.log_change(user_id, "recall_mode", topic_id, {"from": old, "to": mode})


def _owner(store: Store, item_id: str) -> list[str]:
    rec = store.get_topic(item_id)
    if rec is not None:
        return [rec.user_id]
    ex = store.get_exchange(item_id)
    if ex is not None:
        return [ex.user_id]
    return store.list_users()  # an absorbed topic: look in every user's log


def _change(c: ChangeRecord, undone: set[str]) -> Change:
    return Change(id=c.id, user_id=c.user_id, at=c.at, action=c.action, target_id=c.target_id,
                  detail=dict(c.detail), undone=c.id in undone)


def change_history(store: Store, item_id: str, *, user_id: str | None = None, limit: int = 100,
                   scan: int = 20_000) -> list[Change]:
    """Changes concerning ``item_id``, newest first (the last ``scan`` log rows are searched,
    so a merge that moved an exchange shows up in the exchange's history too)."""
    if not isinstance(item_id, str) or not item_id:
        raise ValidationError("item id must be a non-empty string")
    out: list[Change] = []
    for uid in [user_id] if user_id else _owner(store, item_id):
        log = store.list_changes(uid, limit=scan)
        undone = {c.target_id for c in log if c.action == "undo"}
        out += [_change(c, undone) for c in log if mentions(c, item_id)]
    out.sort(key=lambda c: c.at, reverse=True)
    return out[:limit]


def undo(store: Store, change_id: str, settings: TreeSettings, *, user_id: str | None = None,
         phrases: PhraseVectors | None = None) -> Change:
    if not isinstance(change_id, str) or not change_id:
        raise ValidationError("change id must be a non-empty string")
    for uid in [user_id] if user_id else store.list_users():
        change = find_change(store, uid, change_id)
        if change is not None:
            undo_id = undo_change(store, uid, change, settings, phrases)
            rec = find_change(store, uid, undo_id, scan=10)
            assert rec is not None
            return _change(rec, set())
    raise NotFoundError(f"no change {change_id!r}")


__all__ = ["read_topic", "extractive_detail", "set_recall_mode", "change_history", "undo"]
