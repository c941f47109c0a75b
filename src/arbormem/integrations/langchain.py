"""LangChain tools over arbormem: CoMeT's index / read / search trio, bound to one user.

``memory_tools(memory, user_id)`` returns three ``StructuredTool`` objects an agent can call:

- ``get_memory_index(offset)`` - the topic tree as an indented outline (id, title, size,
  dates, keywords): what the memory holds, in pages of at most ~1500 tokens;
- ``read_memory_node(node_id, depth)`` - one topic: depth 0 summary, 1 detailed summary
  (the LLM's when configured, else extractive), 2 the verbatim exchanges;
- ``search_memory(query, limit)`` - ranked exchanges with their topic paths.

Tools return plain text (what a model reads best); library errors come back as a one-line
``error: ...`` string so the agent can recover instead of the run failing.
"""

from __future__ import annotations

from typing import Any

try:
    from langchain_core.tools import StructuredTool
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("memory_tools needs LangChain: pip install 'arbormem[integrations]'") from exc

from ..errors import ArbormemError, ValidationError
from ..memory import Memory
from ..models import Topic
from ..server import views
from ..validate import user_id as check_user


def _day(t: Any) -> str:
    return t.isoformat()[:10] if t else ""


def memory_index(memory: Memory, user_id: str, *, offset: int = 0, max_tokens: int = 1500) -> str:
    """The user's topic tree as an indented outline, one node per line, in pages of at most
    ``max_tokens`` (cl100k): a long memory is read page by page (``offset`` = the first node
    of the page, as the previous page's last line says), never as one 16k-character dump."""
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ValidationError("offset must be a non-negative integer")
    root = memory.tree(user_id=user_id)
    lines: list[str] = []

    def walk(node: Topic, indent: int) -> None:
        if node.kind != "root":
            span = _day(node.first_at) + (f"..{_day(node.last_at)}" if _day(node.last_at) != _day(node.first_at) else "")
            kw = ", ".join(node.keywords[:5])
            lines.append(f"{'  ' * indent}- [{node.id}] {node.title} ({node.kind}, {node.size} exchanges, {span})"
                         + (f" — {kw}" if kw else ""))
        for child in node.children:
            walk(child, indent + (node.kind != "root"))

    walk(root, 0)
    if not lines:
        return "The memory is empty."
    head = "Memory index (read a node with read_memory_node):"
    page: list[str] = []
    used = memory.tokens.count(head) + 40  # room for the closing line
    for line in lines[offset:]:
        cost = memory.tokens.count(line) + 1
        if page and used + cost > max_tokens:
            break
        page.append(line)
        used += cost
    end = offset + len(page)
    if not page:
        return f"The index has {len(lines)} nodes; offset {offset} is past the end."
    more = (f"\n(nodes {offset + 1}-{end} of {len(lines)}; call get_memory_index with offset={end} for more)"
            if end < len(lines) or offset else "")
    return head + "\n" + "\n".join(page) + more


def read_node(memory: Memory, user_id: str, node_id: str, depth: int = 0) -> str:
    """One node at a depth, as text."""
    data = views.read_topic(memory, user_id, node_id, depth)
    t = data["topic"]
    out = [f"{' › '.join(t['path'])} [{t['id']}] ({t['kind']}, {t['size']} exchanges)",
           f"keywords: {', '.join(t['keywords'])}", f"summary: {t['summary']}"]
    if depth >= 1:
        out.append(f"detail ({data['detail_source']}):\n{data['detail']}")
    for ex in data.get("exchanges", []):
        out.append(f"--- #{ex['seq']} {ex['user_at'][:10]}\nuser: {ex['user_text']}"
                   + (f"\nassistant: {ex['assistant_text']}" if ex["assistant_text"] else ""))
    return "\n".join(out)


def search_text(memory: Memory, user_id: str, query: str, limit: int = 5) -> str:
    hits = memory.search(query, user_id=user_id, limit=limit)
    if not hits:
        return "No matching memories."
    return "\n".join(
        f"{i}. [{h.exchange.id}] {' › '.join(h.path)} ({_day(h.exchange.user_at)}, score {h.score:.3f})\n"
        f"   user: {h.exchange.user_text}"
        + (f"\n   assistant: {h.exchange.assistant_text}" if h.exchange.assistant_text else "")
        for i, h in enumerate(hits, 1)
    )


def memory_tools(memory: Memory, user_id: str) -> list[StructuredTool]:
    """The three tools for ``user_id`` (see the module docstring)."""
    uid = check_user(user_id)

    def safe(fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> str:
            try:
                return str(fn(*args, **kwargs))
            except ArbormemError as exc:
                return f"error: {exc.code}: {exc}"
        return run

    def get_memory_index(offset: int = 0) -> str:
        return memory_index(memory, uid, offset=offset)

    def read_memory_node(node_id: str, depth: int = 0) -> str:
        return read_node(memory, uid, node_id, depth)

    def search_memory(query: str, limit: int = 5) -> str:
        return search_text(memory, uid, query, limit)

    return [
        StructuredTool.from_function(
            safe(get_memory_index), name="get_memory_index",
            args_schema=_schema("get_memory_index", offset=(int, 0)),
            description="List what long-term memory holds: the topic tree with node ids, titles, "
                        "sizes, dates and keywords, a page of at most ~1500 tokens at a time "
                        "(the last line gives the offset of the next page). Call first, then "
                        "read_memory_node."),
        StructuredTool.from_function(
            safe(read_memory_node), name="read_memory_node",
            args_schema=_schema("read_memory_node", node_id=(str, ...), depth=(int, 0)),
            description="Read one memory node by id. depth 0 = summary, 1 = detailed summary, "
                        "2 = the verbatim exchanges."),
        StructuredTool.from_function(
            safe(search_memory), name="search_memory",
            args_schema=_schema("search_memory", query=(str, ...), limit=(int, 5)),
            description="Search long-term memory for exchanges relevant to a query; returns them "
                        "with their topic paths and dates."),
    ]


def _schema(name: str, **fields: Any) -> Any:
    from pydantic import create_model

    return create_model(f"{name}_args", **fields)


__all__ = ["memory_tools", "memory_index", "read_node", "search_text"]
