"""Read views shared by the HTTP API, the MCP server and ``arbormem chat``.

They take a ``Memory`` and a user id and always stay inside that user's partition: an id
that belongs to another user is reported as not found, never served.
"""

from __future__ import annotations

from typing import Any

from ..errors import NotFoundError, ValidationError
from ..memory import Memory
from ..models import Exchange, Topic
from ..render import packet_header, render_exchange

DEPTHS = (0, 1, 2)


def owned_exchange(mem: Memory, user_id: str, exchange_id: str) -> Exchange:
    """The exchange if it belongs to ``user_id``; NotFoundError otherwise (no existence leak).
    The check lives in the core (``Memory.get(..., user_id=...)``); kept for callers."""
    return mem.get(exchange_id, user_id=user_id)


def known_item(mem: Memory, user_id: str, item_id: str) -> None:
    """NotFoundError unless ``item_id`` is an exchange or topic of ``user_id`` (for routes
    that would otherwise answer an empty list for an id that never existed)."""
    try:
        mem.get(item_id, user_id=user_id)
    except NotFoundError:
        mem.topic(item_id, user_id=user_id)  # raises NotFoundError("no topic ...") in turn


def topic_exchanges(mem: Memory, user_id: str, topic_id: str, *, limit: int = 200) -> list[Exchange]:
    """Completed exchanges under a topic (or every topic below a theme), in sequence order."""
    topic = mem.topic(topic_id, user_id=user_id)
    if topic.kind == "topic":
        leaves = [topic.id]
    else:
        root = mem.tree(user_id=user_id)
        node = next((t for t in root.walk() if t.id == topic.id), None)
        leaves = [t.id for t in (node.walk() if node else []) if t.kind == "topic"]
    out: list[Exchange] = []
    for leaf in leaves:
        out.extend(mem.store.list_exchanges(user_id, status="completed", topic_id=leaf, limit=limit))
    out.sort(key=lambda e: e.seq)
    return out[:limit]


def read_topic(mem: Memory, user_id: str, topic_id: str, depth: int = 0, *, limit: int = 200) -> dict[str, Any]:
    """A topic at a depth, over ``Memory.read``: 0 = title, keywords, summary; 1 = + the
    detailed summary (the LLM's when one is configured, else extractive); 2 = + the verbatim
    exchanges (for a theme: those of every topic below it), and ``text`` becomes the packet
    as recall renders it."""
    if depth not in DEPTHS:
        raise ValidationError("depth must be 0 (summary), 1 (detailed summary) or 2 (verbatim)")
    base = mem.read(topic_id, user_id=user_id, depth=0)
    out: dict[str, Any] = {"topic": topic_dict(base.topic), "depth": depth, "text": base.text,
                           "recall_mode": base.recall_mode, "tags": list(base.tags),
                           "links": list(base.links)}
    if depth >= 1:
        detail = mem.read(topic_id, user_id=user_id, depth=1)
        out["detail"], out["detail_source"] = detail.text, detail.source
    if depth == 2:
        if base.topic.kind == "topic":
            exchanges = list(mem.read(topic_id, user_id=user_id, depth=2).exchanges)[:limit]
        else:
            exchanges = topic_exchanges(mem, user_id, topic_id, limit=limit)
        out["exchanges"] = [e.to_dict() for e in exchanges]
        # The packet as recall quotes it: header line, then the verbatim exchanges.
        out["text"] = "\n".join([packet_header(base.topic.path),
                                 *(render_exchange(e) for e in exchanges)])
    return out


def topic_dict(t: Topic) -> dict[str, Any]:
    """A topic without its children (for lists)."""
    d = t.to_dict()
    d.pop("children", None)
    return d


def recall_dict(r: Any) -> dict[str, Any]:
    """The HTTP/MCP shape of a Recall: text, tokens, exchanges and topics with provenance."""
    return {
        "text": r.text, "tokens": r.tokens,
        "exchanges": [e.to_dict() for e in r.exchanges],
        "topics": [topic_dict(t) for t in r.topics],
        "trace": r.trace.to_dict(),
    }


__all__ = ["owned_exchange", "known_item", "topic_exchanges", "read_topic", "topic_dict", "recall_dict"]
