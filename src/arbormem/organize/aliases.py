"""Aliases: a merged topic is found by its best part.

A merged topic's centroid is the mean of its parts, so for a query about one part it scores
lower than that part did alone (on LoCoMo this cost one question at 2,048 tokens). So each
part's centroid stays in the topic vector index under an alias id that names the survivor,
``<survivor>~<part>``: recall maps an alias hit to its survivor with no database lookup
(``resolve_topic_hits``) and the topic scores as its best part. The parts (the survivor's own
pre-merge content included) are listed in the survivor's ``meta.aliases``.

Text cannot have alias entries: both stores index a topic's text only while a topic row of
that id exists (SQLite keys the full-text row by the topic's rowid). So the parts' pre-merge
titles, keywords and summaries (``meta.part_text``) are added to the survivor's own text
entry (``index_text.topic_index_text``): a merge's recomputed labels no longer drop the words
a part was found by (on LoCoMo an evidence turn lost its topic's lexical lift that way).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..store.base import Store, TopicRecord
from ..store.state import TopicMeta
from .index_text import label_text

ALIAS_SEP = "~"


def alias_id(survivor_id: str, part_id: str) -> str:
    """The topic-index id under which ``survivor_id`` keeps the centroid of one of its parts."""
    return f"{survivor_id}{ALIAS_SEP}{part_id}"


def alias_owner(item_id: str) -> str:
    """The topic an index id stands for: the survivor for an alias, else the id itself."""
    return item_id.split(ALIAS_SEP, 1)[0]


def is_alias(item_id: str) -> bool:
    return ALIAS_SEP in item_id


def resolve_topic_hits(ranked: Sequence[tuple[str, float]]) -> list[tuple[str, float, int]]:
    """Topic index hits (best first) as ``(topic id, best score, rank)``: alias hits mapped to
    their survivors, each topic once, at the rank of its best part.

    Ranks count every part as if it were still a topic of its own, and a merged topic whose
    parts were found is represented by them, not by its mean centroid: so for rank-based
    fusion a merge changes nothing but that the parts now lift one topic. (Dropping the
    absorbed part's slot would move every topic below it up one rank; on LoCoMo that alone
    moved evidence across the budget edge.)"""
    parted = {alias_owner(i) for i, _ in ranked if is_alias(i)}
    out: list[tuple[str, float, int]] = []
    seen: set[str] = set()
    rank = 0
    for item, score in ranked:
        if item in parted:
            continue  # the merged topic's mean centroid, when its parts are in the list
        tid = alias_owner(item)
        if tid not in seen:
            seen.add(tid)
            out.append((tid, score, rank))
        rank += 1
    return out


def drop_aliases(store: Store, rec: TopicRecord) -> None:
    """Remove a topic's alias entries (when an exchange leaves it: the parts' centroids would
    be stale, and a deleted exchange must leave nothing derived from it behind). The caller
    writes ``rec``; the topic then scores by its own centroid, as any topic does."""
    parts, rec.meta.aliases, rec.meta.part_text = rec.meta.aliases, [], {}
    for part in parts:
        store.delete_index("topic", alias_id(rec.id, part))


def _move(store: Store, user_id: str, src: str, dst: str, parts: Sequence[str],
          known: Mapping[str, np.ndarray] | None = None) -> list[str]:
    """Re-key the alias vectors of ``parts`` from topic ``src`` to topic ``dst``; returns the
    parts whose vector existed (and moved)."""
    if not parts:
        return []
    ids = [alias_id(src, p) for p in parts]
    old = {i: known[i] for i in ids if i in known} if known is not None else store.get_vectors(user_id, "topic", ids)
    for p in parts:
        store.delete_index("topic", alias_id(src, p))
    kept = [p for p in parts if alias_id(src, p) in old]
    if kept:
        store.put_vectors(user_id, "topic", [alias_id(dst, p) for p in kept],
                          np.stack([old[alias_id(src, p)] for p in kept]))
    return kept


def alias_merge(store: Store, survivor: TopicRecord, absorbed: TopicRecord,
                known: Mapping[str, np.ndarray] | None = None) -> None:
    """Before ``survivor`` absorbs ``absorbed`` (both still unchanged): index the parts of the
    merged topic under the survivor's aliases. ``known``: the absorbed topic's alias vectors,
    when the caller fetched them for a batch."""
    uid = survivor.user_id
    parts = list(survivor.meta.aliases)
    fresh: dict[str, np.ndarray] = {}
    own = survivor.centroid()
    texts = dict(survivor.meta.part_text)
    if not parts and own is not None:  # first merge: the survivor's own content is a part
        fresh[survivor.id] = own
        texts[survivor.id] = label_text(survivor)
    # A topic that was itself a survivor hands over its parts, not its mean.
    moved = _move(store, uid, absorbed.id, survivor.id, list(absorbed.meta.aliases), known)
    other = absorbed.centroid()
    if not moved and other is not None:
        fresh[absorbed.id] = other
    texts.update(absorbed.meta.part_text if moved else {absorbed.id: label_text(absorbed)})
    if fresh:
        store.put_vectors(uid, "topic", [alias_id(survivor.id, p) for p in fresh], np.stack(list(fresh.values())))
    out = list(dict.fromkeys([*parts, *fresh, *moved]))
    if out:
        survivor.meta.aliases = out
        survivor.meta.part_text = {p: texts[p] for p in out if p in texts}


def alias_unmerge(store: Store, survivor: TopicRecord, restored: TopicRecord, snap_meta: TopicMeta) -> None:
    """On undo: the restored topic takes its parts back (under its own aliases, if it was a
    survivor itself); the survivor drops its aliases once only its own part is left.
    ``snap_meta``: the restored topic's meta as it was before the merge."""
    uid = survivor.user_id
    theirs = list(snap_meta.aliases)
    if theirs:
        kept = _move(store, uid, survivor.id, restored.id, theirs)
    else:
        store.delete_index("topic", alias_id(survivor.id, restored.id))
        kept = []
    if kept:
        restored.meta.aliases = kept
    else:
        restored.meta.aliases, restored.meta.part_text = [], {}
    gone = set(theirs) | {restored.id}
    rest = [p for p in survivor.meta.aliases if p not in gone]
    if set(rest) <= {survivor.id}:
        # Unmerged back to one part: its own centroid (rewritten by the flush) says it all.
        drop_aliases(store, survivor)
    else:
        survivor.meta.aliases = rest
        texts = survivor.meta.part_text
        survivor.meta.part_text = {p: texts[p] for p in rest if p in texts}


__all__ = ["alias_id", "alias_merge", "alias_owner", "alias_unmerge", "drop_aliases", "is_alias",
           "resolve_topic_hits"]
