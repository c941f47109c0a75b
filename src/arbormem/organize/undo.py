"""Undo and history of the organiser's changes: every merge, archive, dedup, supersession,
link and top-level stray's move home is logged with what it takes to reverse it (``undo_change``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..config import TreeSettings
from ..errors import NotFoundError, StateError
from ..store.base import ChangeRecord, Store
from ..store.state import ExchangeMarks
from .merge import set_links, unmerge
from .title_vectors import PhraseVectors
from .tree import TreeSession

#: Change-log actions that ``undo_change`` can reverse.
UNDOABLE = frozenset({"merge", "archive", "dedup", "supersede", "link", "rehome"})


def find_change(store: Store, user_id: str, change_id: str, scan: int = 100_000) -> ChangeRecord | None:
    return next((c for c in store.list_changes(user_id, limit=scan) if c.id == change_id), None)


def is_undone(store: Store, user_id: str, change_id: str) -> bool:
    return any(c.action == "undo" for c in store.list_changes(user_id, target_id=change_id, limit=10))


def undo_change(store: Store, user_id: str, change: ChangeRecord, settings: TreeSettings,
                phrases: PhraseVectors | None = None) -> str:
    """Reverse one logged merge, archive, dedup, supersession, link or top-level stray's move
    (``rehome``); returns the undo's id."""
    if change.action not in UNDOABLE:
        raise StateError(f"a {change.action!r} change cannot be undone")
    if is_undone(store, user_id, change.id):
        raise StateError(f"change {change.id} was already undone")
    d = change.detail
    with store.transaction(user_id):
        restored: dict[str, Any] = {}
        if change.action == "merge":
            tree = TreeSession(store, user_id, settings, phrases=phrases)
            seq = max(0, tree.root.end_seq or 0)
            restored["topic"] = unmerge(store, tree, d, seq)
            tree.flush()
        elif change.action in ("archive", "dedup"):
            ex = store.get_exchange(change.target_id)
            if ex is None:
                raise NotFoundError(f"exchange {change.target_id} no longer exists")
            marks = dataclasses.replace(ExchangeMarks.of(ex.metadata), duplicate_of=None)
            store.update_exchange(dataclasses.replace(ex, metadata=marks.apply(ex.metadata), archived=False))
        elif change.action == "supersede":
            ex = store.get_exchange(change.target_id)
            if ex is not None:
                marks = dataclasses.replace(ExchangeMarks.of(ex.metadata), superseded_by=None)
                store.update_exchange(dataclasses.replace(ex, metadata=marks.apply(ex.metadata)))
            newer = store.get_exchange(str(d.get("by")))
            if newer is not None:
                nm = ExchangeMarks.of(newer.metadata)
                nm = dataclasses.replace(nm, supersedes=tuple(i for i in nm.supersedes if i != change.target_id))
                store.update_exchange(dataclasses.replace(newer, metadata=nm.apply(newer.metadata)))
        elif change.action == "rehome":
            # Back to the top level, and kept there: the next run must not move it again.
            tree = TreeSession(store, user_id, settings, phrases=phrases)
            leaf = tree.get(change.target_id)
            if leaf is None:
                raise NotFoundError(f"topic {change.target_id} no longer exists")
            # Where it came from: the top level (short returns, namesakes, related branches),
            # or the theme the misplaced-topics step took it out of, while that theme is there.
            origin = tree.get(str(d.get("from", "")))
            if origin is not None and origin.kind == "theme" and origin.id != leaf.id:
                tree.put_under(leaf, origin)
            else:
                tree.to_top(leaf)
            leaf.meta.stays = True
            tree.touch(leaf, summarise=False)
            tree.flush()
        elif change.action == "link":
            tree = TreeSession(store, user_id, settings, phrases=phrases)
            a, b = tree.get(d["a"]), tree.get(d["b"])
            for x, y in ((a, b), (b, a)):
                if x is not None and y is not None:
                    set_links(x, [t for t in x.meta.links if t != y.id])
                    tree.touch(x)
            tree.flush()
        return store.log_change(user_id, "undo", change.id, {"action": change.action, "target": change.target_id, **restored})


def mentions(change: ChangeRecord, item_id: str) -> bool:
    """Whether a change concerns ``item_id`` (as target or anywhere in its detail)."""
    if change.target_id == item_id:
        return True

    def walk(v: Any) -> bool:
        if isinstance(v, str):
            return v == item_id
        if isinstance(v, Mapping):
            return any(walk(x) for x in v.values())
        if isinstance(v, (list, tuple)):
            return any(walk(x) for x in v)
        return False

    return walk(change.detail)



__all__ = ["UNDOABLE", "find_change", "is_undone", "mentions", "undo_change"]
