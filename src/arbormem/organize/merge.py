"""Merging two topics and undoing it, inside a ``TreeSession`` (the user's transaction).

A merge is a structural edit of the same kind as a split, so it goes through the session's
public mutation API (``touch``, ``drop``, ``attach``, ``refresh``, ``rebuild_leaf``,
``bound_fanout``) and ``flush`` writes every touched node once. Ids are stable: the absorbed
topic's exchanges take the survivor's id, the absorbed topic is kept whole in the change log
(``snapshot``), and ``unmerge`` restores it with its own id.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..errors import StateError
from ..store.base import Store, TopicRecord
from ..store.state import TopicMeta
from ..text import merge_counts, prune_counts
from .aliases import alias_merge, alias_unmerge
from .tree import LEAF_TERMS, TreeSession


def snapshot(rec: TopicRecord) -> dict[str, Any]:
    """A topic's labels, span and meta as logged with a merge (what ``unmerge`` restores)."""
    return {
        "id": rec.id, "parent_id": rec.parent_id, "title": rec.title, "keywords": list(rec.keywords),
        "summary": rec.summary, "size": rec.size, "start_seq": rec.start_seq, "end_seq": rec.end_seq,
        "created_seq": rec.created_seq, "frozen": rec.frozen, "meta": rec.meta.encode(),
    }


def set_links(rec: TopicRecord, links: Iterable[str]) -> None:
    """Set a topic's links: each once, never to itself. Links are symmetric: callers update
    both ends."""
    rec.meta.links = [t for t in dict.fromkeys(links) if t != rec.id]


def merge_topics(store: Store, tree: TreeSession, survivor: TopicRecord, absorbed: TopicRecord,
                 defer: list[TopicRecord] | None = None,
                 alias_vectors: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
    """Move every exchange of ``absorbed`` into ``survivor`` and remove ``absorbed`` from the
    tree, keeping every aggregate and index exact. Returns the undo detail for the log.

    With ``defer``, the ancestors to recompute are appended to it instead (the caller runs
    ``tree.refresh`` once after a batch of merges). ``alias_vectors``: the absorbed topic's
    alias vectors, fetched for a whole batch at once (one query instead of one per merge)."""
    uid = survivor.user_id
    before = snapshot(survivor)
    snap = snapshot(absorbed)
    alias_merge(store, survivor, absorbed, alias_vectors)  # from the pre-merge centroids
    moved = store.list_exchanges(uid, topic_id=absorbed.id)
    for ex in moved:
        store.update_exchange(dataclasses.replace(ex, topic_id=survivor.id))
    # The survivor: sums add exactly; terms are bounded counters (as placement keeps them).
    if absorbed.vec_sum is not None:
        survivor.vec_sum = absorbed.vec_sum.copy() if survivor.vec_sum is None else survivor.vec_sum + absorbed.vec_sum
    survivor.size += absorbed.size
    for attr, pick in (("start_seq", min), ("end_seq", max), ("first_at", min), ("last_at", max)):
        vals = [v for v in (getattr(survivor, attr), getattr(absorbed, attr)) if v is not None]
        setattr(survivor, attr, pick(vals) if vals else None)
    survivor.terms = prune_counts(merge_counts(survivor.terms, absorbed.terms.items()), LEAF_TERMS)
    survivor.meta.absorbed = [*survivor.meta.absorbed, absorbed.id]
    survivor.meta.tags_size = None  # tags are renormalised on the next pass
    survivor.meta.detail = None
    survivor.meta.detail_x = None
    # Links: the survivor inherits them and every linked topic points at the survivor, so no
    # link dangles (links are symmetric, so the absorbed topic's list finds every back-link).
    links = [*survivor.meta.links, *absorbed.meta.links]
    set_links(survivor, [t for t in links if t != absorbed.id])
    for tid in absorbed.meta.links:
        other = tree.get(tid)
        if other is None or other.id == survivor.id:
            continue
        set_links(other, [survivor.id if t == absorbed.id else t for t in other.meta.links])
        tree.touch(other)
    tree.touch(survivor, summarise=True)
    parent = tree.get(absorbed.parent_id) if absorbed.parent_id else None
    tree.drop(absorbed)
    touched = [n for n in (parent, tree.get(survivor.parent_id) if survivor.parent_id else None) if n is not None]
    if defer is None:
        tree.refresh(touched)
    else:
        defer.extend(touched)
    return {"survivor": survivor.id, "absorbed": snap, "survivor_before": before,
            "exchanges": [e.id for e in moved]}


def unmerge(store: Store, tree: TreeSession, detail: Mapping[str, Any], seq: int) -> str:
    """Restore a topic absorbed by a merge, with its own id, exchanges and labels."""
    snap = detail["absorbed"]
    survivor = tree.get(detail["survivor"])
    if survivor is None:
        raise StateError("the surviving topic no longer exists (undo the later change first)")
    if tree.get(snap["id"]) is not None:
        raise StateError(f"topic {snap['id']} already exists")
    parent = tree.get(snap["parent_id"]) if snap.get("parent_id") else None
    if parent is None or parent.kind != "theme" or any(c.kind == "theme" for c in tree.children(parent)):
        parent = tree.get(survivor.parent_id) if survivor.parent_id else tree.root
    assert parent is not None
    snap_meta = TopicMeta.decode(snap.get("meta"))
    rec = TopicRecord(
        id=snap["id"], user_id=survivor.user_id, kind="topic", parent_id=parent.id, title=snap["title"],
        keywords=list(snap["keywords"]), summary=snap["summary"], frozen=True,
        created_seq=int(snap.get("created_seq") or 0), meta=snap_meta.copy(),
    )
    tree.attach(rec, parent)
    back = [e for e in store.get_exchanges(survivor.user_id, list(detail.get("exchanges", [])))
            if e.topic_id == survivor.id]
    for ex in back:
        store.update_exchange(dataclasses.replace(ex, topic_id=rec.id))
    tree.rebuild_leaf(rec)
    tree.rebuild_leaf(survivor)
    survivor.meta.absorbed = [t for t in survivor.meta.absorbed if t != rec.id]
    alias_unmerge(store, survivor, rec, snap_meta)
    before = detail.get("survivor_before") or {}
    if survivor.size == before.get("size"):
        # Back to its pre-merge content: its pre-merge labels are right again (LLM ones too).
        survivor.title, survivor.keywords, survivor.summary = before["title"], list(before["keywords"]), before["summary"]
        tree.touch(survivor, summarise=False)
    if rec.size == snap.get("size"):
        tree.touch(rec, summarise=False)
    for tid in rec.meta.links:
        other = tree.get(tid)
        if other is not None:
            set_links(other, [*other.meta.links, rec.id])
            tree.touch(other)
    set_links(rec, [t for t in rec.meta.links if tree.get(t) is not None])
    tree.refresh([n for n in (parent, tree.get(survivor.parent_id) if survivor.parent_id else None) if n])
    # An undone merge must not be redone by the next run: the pair is kept apart for good.
    rec.meta.no_merge = [*rec.meta.no_merge, survivor.id]
    survivor.meta.no_merge = [*survivor.meta.no_merge, rec.id]
    tree.bound_fanout(parent, seq)
    return rec.id


__all__ = ["merge_topics", "set_links", "snapshot", "unmerge"]
