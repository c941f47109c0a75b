"""A LangGraph ``BaseStore`` over arbormem, bound to one user.

**The BaseStore contract, by the caller's namespace** (the default view): ``put(ns, key,
value)`` stores the value as an exchange (its text is ``value["content"]`` / ``["text"]`` /
``["memory"]`` when that is a string, else the JSON of the value) and the tree files it like
any exchange; ``get(ns, key)``, ``search(ns_prefix, query=..., filter=...)``,
``list_namespaces(prefix=..., suffix=..., max_depth=...)`` and ``delete(ns, key)`` then
address it by the namespace and key the caller gave, as LangGraph's ``InMemoryStore`` does:
keys are unique per namespace, a second ``put`` of the same ``(ns, key)`` replaces the item
(one transaction), ``put(ns, key, None)`` / ``delete`` remove it from every index. Search with
a query ranks the items under the prefix by cosine similarity to the query (exact, over
their stored vectors); without one it lists them, most recently updated first.

**The topic tree, as an extra view**: ``ArbormemStore(mem, user, view="tree")`` (or
``store.tree_view()``) reads the same memory with topic paths as namespaces: every exchange
of the user is an item (key = exchange id, or the key it was put under) in the namespace of
its topic path, ``list_namespaces()`` is the tree, ``search(("Travel",), query=...)`` searches
a branch with arbormem's hybrid ranking. Writes through it are the same ``put`` (the caller's
namespace is recorded; the tree view shows where the tree filed it).

Item lookups use per-user marker rows in the store's change log (indexed, like document
hashes), so they work across processes. ``abatch`` runs ``batch`` in a worker thread.
Namespace labels in the tree view have ``.`` replaced by ``\u2024`` (LangGraph forbids dots).
TTLs are not supported (``supports_ttl = False``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

try:
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        Item,
        ListNamespacesOp,
        MatchCondition,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
    )
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("ArbormemStore needs LangGraph: pip install 'arbormem[integrations]'") from exc

from ..errors import NotFoundError, ValidationError
from ..memory import Memory
from ..models import Exchange, Topic
from ..validate import user_id as check_user

KEY_PREFIX = "lgkey:"
#: Change-log target listing every item put through the store (``detail.exchange_id``).
ITEMS_TARGET = "langgraph:items"
_TEXT_FIELDS = ("content", "text", "memory")
View = Literal["namespaces", "tree"]


def _label(title: str) -> str:
    # LangGraph rejects '.' inside namespace labels; a one-dot leader keeps titles readable
    # and lets a returned namespace be passed back in.
    return (title or "untitled").replace(".", "\u2024")


def _key_target(namespace: Sequence[str], key: str) -> str:
    raw = json.dumps([list(namespace), key], ensure_ascii=False)
    return KEY_PREFIX + hashlib.sha256(raw.encode("utf-8")).hexdigest()


class ArbormemStore(BaseStore):
    """LangGraph store over ``memory`` for ``user_id`` (see the module docstring)."""

    supports_ttl = False

    def __init__(self, memory: Memory, user_id: str, *, view: View = "namespaces") -> None:
        if view not in ("namespaces", "tree"):
            raise ValidationError("view must be 'namespaces' (the BaseStore contract) or 'tree'")
        self.memory = memory
        self.user_id = check_user(user_id)
        self.view: View = view

    def tree_view(self) -> ArbormemStore:
        """The same memory with topic paths as namespaces (see the module docstring)."""
        return ArbormemStore(self.memory, self.user_id, view="tree")

    # -- LangGraph entry points -------------------------------------------------------------
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self._get(tuple(op.namespace), op.key))
            elif isinstance(op, SearchOp):
                results.append(self._search(op))
            elif isinstance(op, PutOp):
                self._put(op)
                results.append(None)
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list_namespaces(op))
            else:
                raise ValidationError(f"unknown LangGraph store operation {type(op).__name__}")
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await asyncio.to_thread(self.batch, list(ops))

    # -- items put through the store ----------------------------------------------------------
    def _find(self, namespace: tuple[str, ...], key: str) -> Exchange | None:
        """The live item put under ``(namespace, key)``."""
        store = self.memory.store
        for target in (_key_target(namespace, key), KEY_PREFIX + key):  # then the pre-namespace marker
            for change in store.list_changes(self.user_id, target_id=target, limit=5):
                ex_id = str(change.detail.get("exchange_id", ""))
                ex = store.get_exchange(ex_id) if ex_id else None
                if ex is not None and ex.user_id == self.user_id and _put_ns(ex) == namespace \
                        and _put_key(ex) == key:
                    return ex
        return None

    def _put_items(self) -> list[Exchange]:
        """Every live item put through the store (one indexed log read, then the rows)."""
        store = self.memory.store
        ids = [str(c.detail.get("exchange_id", "")) for c in
               store.list_changes(self.user_id, target_id=ITEMS_TARGET, limit=10_000_000)]
        live = store.get_exchanges(self.user_id, [x for x in dict.fromkeys(ids) if x])
        return [ex for ex in live if ex.status == "completed" and _put_ns(ex) is not None]

    def _put(self, op: PutOp) -> None:
        namespace = tuple(op.namespace)
        if op.value is None:
            with self.memory.store.transaction(self.user_id):
                old = self._find(namespace, op.key)
                if old is not None:
                    self.memory.delete(old.id, user_id=self.user_id)
            return
        if not isinstance(op.value, Mapping):
            raise ValidationError(f"a LangGraph item value must be a dict, got {type(op.value).__name__}")
        try:
            value = json.loads(json.dumps(dict(op.value), default=str))
        except (TypeError, ValueError) as exc:
            raise ValidationError(f"the item value is not JSON-serialisable: {exc}") from None
        text = next((value[f] for f in _TEXT_FIELDS if isinstance(value.get(f), str) and value[f].strip()),
                    None) or json.dumps(value, ensure_ascii=False, sort_keys=True)
        meta = {"langgraph": {"namespace": list(namespace), "key": op.key, "value": value}}
        store = self.memory.store
        # One transaction (nested ones join it): the replaced item, the new one and its
        # markers change together, and a concurrent put of the same key waits.
        with store.transaction(self.user_id):
            old = self._find(namespace, op.key)
            if old is not None:
                self.memory.delete(old.id, user_id=self.user_id)
            ex = self.memory.add([{"role": "user", "content": text}], user_id=self.user_id,
                                 at=old.user_at if old is not None else None, metadata=meta)
            store.log_change(self.user_id, "langgraph_put", _key_target(namespace, op.key), {"exchange_id": ex.id})
            store.log_change(self.user_id, "langgraph_put", ITEMS_TARGET, {"exchange_id": ex.id})

    # -- reads --------------------------------------------------------------------------------
    def _paths(self) -> dict[str, tuple[str, ...]]:
        root = self.memory.tree(user_id=self.user_id)
        return {t.id: tuple(_label(p) for p in t.path) for t in root.walk() if t.kind != "root"}

    def _item(self, ex: Exchange, namespace: tuple[str, ...], score: float | None = None,
              search: bool = False) -> Item:
        lg = ex.metadata.get("langgraph") if isinstance(ex.metadata, dict) else None
        if isinstance(lg, dict):
            key, value = str(lg.get("key")), dict(lg.get("value") or {})
        else:
            key = ex.id
            value = {"user": ex.user_text, "assistant": ex.assistant_text,
                     "messages": [dict(m) for m in ex.messages], "metadata": dict(ex.metadata)}
        created = ex.user_at
        updated = ex.assistant_at or ex.user_at
        if search:
            return SearchItem(namespace=namespace, key=key, value=value, created_at=created,
                              updated_at=updated, score=score)
        return Item(namespace=namespace, key=key, value=value, created_at=created, updated_at=updated)

    def _get(self, namespace: tuple[str, ...], key: str) -> Item | None:
        if self.view == "namespaces":
            ex = self._find(namespace, key)
            return None if ex is None else self._item(ex, namespace)
        # Tree view: an item's namespace is where the tree filed it, which reorganising may
        # change; the key finds it (an exchange id, or the key an item was put under).
        ex = self._by_key(key)
        if ex is None or ex.status != "completed":
            return None
        return self._item(ex, self._paths().get(ex.topic_id or "", ()))

    def _by_key(self, key: str) -> Exchange | None:
        for ex in self._put_items():
            if _put_key(ex) == key:
                return ex
        plain = self.memory.store.get_exchange(key)
        return plain if plain is not None and plain.user_id == self.user_id else None

    def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        need = op.offset + op.limit
        items: list[Any]  # SearchItems (``_item(..., search=True)``)
        if self.view == "tree":
            items = self._search_tree(op, prefix, need)
        else:
            found = [(ex, ns) for ex in self._put_items() if (ns := _put_ns(ex)) is not None and ns[: len(prefix)] == prefix]
            if op.query:
                scores = self._similarity(op.query, [ex for ex, _ in found])
                ranked = sorted(found, key=lambda pair: -scores.get(pair[0].id, -2.0))
                items = [self._item(ex, ns, scores.get(ex.id), search=True) for ex, ns in ranked]
            else:
                found.sort(key=lambda pair: (pair[0].assistant_at or pair[0].user_at, pair[0].seq), reverse=True)
                items = [self._item(ex, ns, search=True) for ex, ns in found]
        if op.filter:
            items = [it for it in items if all(it.value.get(k) == v for k, v in op.filter.items())]
        return items[op.offset : need]  # type: ignore[return-value]

    def _similarity(self, query: str, items: Sequence[Exchange]) -> dict[str, float]:
        """Cosine of each item's stored vector to the query's (vectors are unit length)."""
        if not items:
            return {}
        qv = self.memory.embedder.embed([query])[0]
        vecs = self.memory.store.get_vectors(self.user_id, "exchange", [ex.id for ex in items])
        return {i: float(np.dot(vec, qv)) for i, vec in vecs.items() if vec.shape == qv.shape}

    def _search_tree(self, op: SearchOp, prefix: tuple[str, ...], need: int) -> list[SearchItem]:
        paths = self._paths()
        want = {tid for tid, p in paths.items() if p[: len(prefix)] == prefix}
        scored: list[tuple[Exchange, float | None]] = []
        if op.query:
            k = min(1000, max(need * 4, 50))
            for h in self.memory.search(op.query, user_id=self.user_id, limit=k):
                if h.exchange.topic_id in want:
                    scored.append((h.exchange, h.score))
        else:
            for tid in want:
                for ex in self.memory.store.list_exchanges(self.user_id, status="completed", topic_id=tid):
                    scored.append((ex, None))
            scored.sort(key=lambda pair: -pair[0].seq)
        return [self._item(ex, paths.get(ex.topic_id or "", ()), score, search=True)  # type: ignore[misc]
                for ex, score in scored]

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        if self.view == "tree":
            root = self.memory.tree(user_id=self.user_id)
            spaces = {tuple(_label(p) for p in t.path) for t in root.walk() if t.kind == "topic"}
        else:
            spaces = {ns for ex in self._put_items() if (ns := _put_ns(ex)) is not None}
        if op.match_conditions:
            spaces = {ns for ns in spaces if all(_matches(c, ns) for c in op.match_conditions)}
        if op.max_depth is not None:
            spaces = {ns[: op.max_depth] for ns in spaces}
        return sorted(spaces)[op.offset : op.offset + op.limit]

    def topic_for(self, namespace: Sequence[str]) -> Topic:
        """The topic (or theme) at a tree-view namespace; NotFoundError if the tree has none."""
        for t in self.memory.tree(user_id=self.user_id).walk():
            if t.kind != "root" and tuple(_label(p) for p in t.path) == tuple(namespace):
                return t
        raise NotFoundError(f"no topic at {tuple(namespace)!r}")


def _put_ns(ex: Exchange) -> tuple[str, ...] | None:
    lg = ex.metadata.get("langgraph") if isinstance(ex.metadata, dict) else None
    ns = lg.get("namespace") if isinstance(lg, dict) else None
    return tuple(str(p) for p in ns) if isinstance(ns, list) else None


def _put_key(ex: Exchange) -> str | None:
    lg = ex.metadata.get("langgraph") if isinstance(ex.metadata, dict) else None
    return str(lg.get("key")) if isinstance(lg, dict) else None


def _matches(cond: MatchCondition, ns: tuple[str, ...]) -> bool:
    path = tuple(cond.path)
    if len(ns) < len(path):
        return False
    pairs = zip(ns, path, strict=False) if cond.match_type == "prefix" else zip(reversed(ns), reversed(path), strict=False)
    return all(p == "*" or a == p for a, p in pairs)

__all__ = ["ArbormemStore"]
