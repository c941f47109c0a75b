"""A LangGraph ``BaseStore`` over arbormem, bound to one user: namespaces are topic paths.

Every exchange of the user is an item. Its **namespace is its topic path** in the tree
(``("Travel", "Japan trip")``), its key is the exchange id, its value ``{"user",
"assistant", "messages", "metadata"}``. Items written through the store keep the caller's
key and value: ``put(ns, key, value)`` stores the value as an exchange (its text is
``value["content"]`` / ``["text"]`` / ``["memory"]`` when that is a string, else the JSON of the
value), the tree files it, and ``get``/``search`` return the value as given, under the topic
path the tree chose. So:

- ``list_namespaces()`` is the topic tree (leaf paths; ``max_depth`` gives themes);
- ``search(("Travel",), query="ryokan")`` searches the branch (hybrid ranking, topic-aware);
  without a query it lists the branch's items, newest first; ``filter`` matches value keys;
- ``get(ns, key)`` finds the item by key (keys are unique per user; the namespace is not
  needed because the tree may move an item when it reorganises), ``delete(ns, key)`` and
  ``put(ns, key, None)`` remove it from every index.

The namespace passed to ``put`` is kept in the item's metadata (``langgraph.namespace``).
Key lookups use a per-user marker row in the store's change log (like document hashes), so
they work across processes. ``abatch`` runs ``batch`` in a worker thread. TTLs are not
supported (``supports_ttl = False``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Sequence

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

from ..errors import NotFoundError
from ..memory import Memory
from ..models import Exchange, Topic
from ..validate import user_id as check_user

KEY_PREFIX = "lgkey:"
_TEXT_FIELDS = ("content", "text", "memory")


def _label(title: str) -> str:
    # LangGraph rejects '.' inside namespace labels; a one-dot leader keeps titles readable
    # and lets a returned namespace be passed back in.
    return (title or "untitled").replace(".", "\u2024")


class ArbormemStore(BaseStore):
    """LangGraph store over ``memory`` for ``user_id`` (see the module docstring)."""

    supports_ttl = False

    def __init__(self, memory: Memory, user_id: str) -> None:
        self.memory = memory
        self.user_id = check_user(user_id)

    # -- LangGraph entry points -------------------------------------------------------------
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self._get(op.key))
            elif isinstance(op, SearchOp):
                results.append(self._search(op))
            elif isinstance(op, PutOp):
                self._put(op)
                results.append(None)
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list_namespaces(op))
            else:
                raise ValueError(f"unknown LangGraph store operation {type(op).__name__}")
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await asyncio.to_thread(self.batch, list(ops))

    # -- helpers ----------------------------------------------------------------------------
    def _paths(self) -> dict[str, tuple[str, ...]]:
        root = self.memory.tree(user_id=self.user_id)
        return {t.id: tuple(_label(p) for p in t.path) for t in root.walk() if t.kind != "root"}

    def _find(self, key: str) -> Exchange | None:
        store = self.memory.store
        for change in store.list_changes(self.user_id, target_id=KEY_PREFIX + key, limit=5):
            ex_id = str(change.detail.get("exchange_id", ""))
            ex = store.get_exchange(ex_id) if ex_id else None
            if ex is not None and ex.user_id == self.user_id:
                return ex
        ex = store.get_exchange(key)  # an ordinary exchange: its id is its key
        return ex if ex is not None and ex.user_id == self.user_id else None

    def _item(self, ex: Exchange, paths: dict[str, tuple[str, ...]], score: float | None = None,
              search: bool = False) -> Item:
        lg = ex.metadata.get("langgraph") if isinstance(ex.metadata, dict) else None
        if isinstance(lg, dict):
            key, value = str(lg.get("key")), dict(lg.get("value") or {})
        else:
            key = ex.id
            value = {"user": ex.user_text, "assistant": ex.assistant_text,
                     "messages": [dict(m) for m in ex.messages], "metadata": dict(ex.metadata)}
        ns = paths.get(ex.topic_id or "", ())
        updated = ex.assistant_at or ex.user_at
        if search:
            return SearchItem(namespace=ns, key=key, value=value, created_at=ex.user_at,
                              updated_at=updated, score=score)
        return Item(namespace=ns, key=key, value=value, created_at=ex.user_at, updated_at=updated)

    def _get(self, key: str) -> Item | None:
        ex = self._find(key)
        if ex is None or ex.status != "completed":
            return None
        return self._item(ex, self._paths())

    def _put(self, op: PutOp) -> None:
        if op.value is None:
            old = self._find(op.key)
            if old is not None:
                self.memory.delete(old.id)
            return
        value = json.loads(json.dumps(dict(op.value), default=str))
        text = next((value[f] for f in _TEXT_FIELDS if isinstance(value.get(f), str) and value[f].strip()),
                    None) or json.dumps(value, ensure_ascii=False, sort_keys=True)
        meta = {"langgraph": {"namespace": list(op.namespace), "key": op.key, "value": value}}
        store = self.memory.store
        # One transaction (nested ones join it): the replaced item, the new one and its key
        # marker change together, and a concurrent put of the same key waits.
        with store.transaction(self.user_id):
            old = self._find(op.key)
            if old is not None:
                self.memory.delete(old.id)
            ex = self.memory.add([{"role": "user", "content": text}], user_id=self.user_id,
                                 at=old.user_at if old is not None else None, metadata=meta)
            store.log_change(self.user_id, "langgraph_put", KEY_PREFIX + op.key, {"exchange_id": ex.id})

    def _search(self, op: SearchOp) -> list[SearchItem]:
        paths = self._paths()
        prefix = tuple(op.namespace_prefix)
        want = {tid for tid, p in paths.items() if p[: len(prefix)] == prefix}
        need = op.offset + op.limit
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
        items = [self._item(ex, paths, score, search=True) for ex, score in scored]
        if op.filter:
            items = [it for it in items if all(it.value.get(k) == v for k, v in op.filter.items())]
        return items[op.offset : need]  # type: ignore[return-value]

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        root = self.memory.tree(user_id=self.user_id)
        spaces = {tuple(_label(p) for p in t.path) for t in root.walk() if t.kind == "topic"}
        if op.match_conditions:
            spaces = {ns for ns in spaces if all(_matches(c, ns) for c in op.match_conditions)}
        if op.max_depth is not None:
            spaces = {ns[: op.max_depth] for ns in spaces}
        return sorted(spaces)[op.offset : op.offset + op.limit]

    def topic_for(self, namespace: Sequence[str]) -> Topic:
        """The topic (or theme) at a namespace; NotFoundError if the tree has none."""
        for t in self.memory.tree(user_id=self.user_id).walk():
            if t.kind != "root" and tuple(_label(p) for p in t.path) == tuple(namespace):
                return t
        raise NotFoundError(f"no topic at {tuple(namespace)!r}")


def _matches(cond: MatchCondition, ns: tuple[str, ...]) -> bool:
    path = tuple(cond.path)
    if len(ns) < len(path):
        return False
    pairs = zip(ns, path, strict=False) if cond.match_type == "prefix" else zip(reversed(ns), reversed(path), strict=False)
    return all(p == "*" or a == p for a, p in pairs)

__all__ = ["ArbormemStore"]
