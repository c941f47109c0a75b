"""The MCP server: arbormem as a memory for desktop assistants and agent hosts.

``create_server(memory, user_id)`` builds an ``MCPServer`` (official ``mcp`` SDK; v1 called
it ``FastMCP``) bound to ONE user: no tool takes a user id, so a client can only reach that
user's partition, and ids of anyone else's exchanges or topics are "not found". Tools:

============  ==============================================================  ============
tool          does                                                            annotation
============  ==============================================================  ============
remember      store an exchange (message + reply) or a note (message only)    write
recall        the memory context to inject for a message, within max_tokens   read-only
search        ranked exchanges for a query                                    read-only
list_topics   browse the tree: the children of a theme (top level by default) read-only
read_topic    a topic at a depth: 0 summary, 1 detailed summary, 2 verbatim    read-only
forget        delete an exchange, or every exchange of a topic (a theme of    destructive
              several topics: a preview first, deleted with confirm=true)
============  ==============================================================  ============

``arbormem mcp --db PATH --user ID`` serves it over stdio (what desktop clients launch);
``--http`` serves streamable HTTP, behind the same bearer-token policy as the HTTP API
(``ARBORMEM_API_TOKENS``; a token must be bound to the server's user or ``*``). Tool functions are sync; the SDK runs them in a
worker thread.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import ArbormemError, ConfirmationRequired, NotFoundError, ValidationError
from ..memory import Memory
from ..models import ForgetReport
from . import views
from .auth import BearerGuard, TokenPolicy

F = TypeVar("F", bound=Callable[..., Any])

INSTRUCTIONS = (
    "Long-term memory of your conversations with this user, organised as a tree of topics. "
    "Call `recall` with the user's new message to get relevant earlier exchanges; `remember` "
    "important exchanges; browse with `list_topics` and `read_topic`; `forget` deletes."
)


def _sdk() -> tuple[Any, Any, Any]:
    try:
        from mcp.server.mcpserver.exceptions import ToolError
        from mcp.types import ToolAnnotations
    except ImportError as exc:
        raise ImportError("the MCP server needs the MCP SDK: pip install 'arbormem[mcp]'") from exc
    server_cls: Any
    try:
        from mcp.server import MCPServer as server_cls  # SDK v2
    except ImportError:  # pragma: no cover - SDK v1
        import importlib

        server_cls = importlib.import_module("mcp.server.fastmcp").FastMCP
    return server_cls, ToolAnnotations, ToolError


def _annotations(cls: Any, *, read_only: bool, destructive: bool, idempotent: bool = False) -> Any:
    # SDK v2 names the fields in snake_case; v1 in camelCase (and ignores unknown names).
    values = {"read_only_hint": read_only, "destructive_hint": destructive,
              "idempotent_hint": idempotent, "open_world_hint": False}
    if "read_only_hint" not in getattr(cls, "model_fields", {}):
        values = {"readOnlyHint": read_only, "destructiveHint": destructive,
                  "idempotentHint": idempotent, "openWorldHint": False}
    return cls(**values)


# Long: MCP tools are closures over the server's Memory; one tool per few lines.
def create_server(memory: Memory, user_id: str, *, name: str = "arbormem") -> Any:
    """An MCP server whose tools read and write ``user_id``'s memory in ``memory``."""
    Server, ToolAnnotations, ToolError = _sdk()
    from ..validate import user_id as check_user

    uid = check_user(user_id)
    from .. import __version__

    try:
        server = Server(name, instructions=INSTRUCTIONS, version=__version__)
    except TypeError:  # pragma: no cover - SDK v1 takes no version
        server = Server(name, instructions=INSTRUCTIONS)
    read_only = _annotations(ToolAnnotations, read_only=True, destructive=False)
    write = _annotations(ToolAnnotations, read_only=False, destructive=False)
    destructive = _annotations(ToolAnnotations, read_only=False, destructive=True, idempotent=True)

    def errors(fn: F) -> F:
        # Library errors reach the model as a clear tool error (code + message) instead of the
        # SDK's generic "Error executing tool" for unexpected exceptions.
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except ArbormemError as exc:
                raise ToolError(f"{exc.code}: {exc}") from exc

        return wrapper  # type: ignore[return-value]

    @server.tool(annotations=write)
    @errors
    def remember(message: str, reply: str | None = None, session_id: str | None = None) -> dict[str, Any]:
        """Store an exchange in long-term memory: the user's message and, if given, the
        assistant's reply (without a reply it is stored as a note). Returns its id, sequence
        number and the topic it was filed under."""
        msgs = [{"role": "user", "content": message}]
        if reply:
            msgs.append({"role": "assistant", "content": reply})
        ex = memory.add(msgs, user_id=uid, session_id=session_id)
        topic = memory.topic(ex.topic_id, user_id=uid) if ex.topic_id else None
        return {"id": ex.id, "seq": ex.seq, "topic_id": ex.topic_id,
                "topic_path": list(topic.path) if topic else []}

    @server.tool(annotations=read_only)
    @errors
    def recall(message: str, max_tokens: int = 1024, session_id: str | None = None, since: str | None = None,
               until: str | None = None, metadata: dict[str, str | int | float | bool | None] | None = None,
               min_relevance: float | None = None) -> dict[str, Any]:
        """The memory context relevant to a new user message, within max_tokens: quoted
        earlier exchanges grouped by topic (text), with the exchanges and topics it used.
        Only relevant exchanges (stopped says why packing ended); optional filters: session_id,
        since / until (ISO 8601 times), metadata key equality; min_relevance 0 fills the budget."""
        r = memory.recall(message, user_id=uid, max_tokens=max_tokens, session_id=session_id, since=since,
                          until=until, metadata=metadata, min_relevance=min_relevance)
        return {"text": r.text, "tokens": r.tokens, "stopped": r.trace.stopped,
                "exchanges": [{"id": e.id, "seq": e.seq, "topic_id": e.topic_id,
                               "at": e.user_at.isoformat()} for e in r.exchanges],
                "topics": [{"id": t.id, "path": list(t.path)} for t in r.topics]}

    @server.tool(annotations=read_only)
    @errors
    def search(query: str, limit: int = 10, session_id: str | None = None, since: str | None = None,
               until: str | None = None, metadata: dict[str, str | int | float | bool | None] | None = None,
               min_relevance: float | None = None) -> dict[str, Any]:
        """Exchanges ranked by relevance to a query (lexical + semantic), with topic paths; no
        hit when nothing is relevant. Filters as in recall."""
        hits = memory.search(query, user_id=uid, limit=limit, session_id=session_id, since=since, until=until,
                             metadata=metadata, min_relevance=min_relevance)
        return {"hits": [{"id": h.exchange.id, "score": round(h.score, 6), "relevance": h.relevance,
                          "path": list(h.path),
                          "at": h.exchange.user_at.isoformat(), "user": h.exchange.user_text,
                          "assistant": h.exchange.assistant_text} for h in hits]}

    @server.tool(annotations=read_only)
    @errors
    def list_topics(parent_id: str | None = None) -> dict[str, Any]:
        """Browse the topic tree: the themes and topics directly under parent_id (the top
        level when omitted), with titles, keywords, sizes and dates. Open a theme by passing
        its id as parent_id; read a topic with read_topic."""
        root = memory.tree(user_id=uid)
        node = root if parent_id is None else next((t for t in root.walk() if t.id == parent_id), None)
        if node is None:
            raise NotFoundError(f"no topic {parent_id!r}")
        return {"parent": None if node.kind == "root" else views.topic_dict(node),
                "children": [{**views.topic_dict(c), "children": len(c.children)} for c in node.children]}

    @server.tool(annotations=read_only)
    @errors
    def read_topic(topic_id: str, depth: int = 0, tier: int | None = None) -> dict[str, Any]:
        """Read a topic at a depth: 0 = title, keywords and summary; 1 = a detailed summary;
        2 = the verbatim exchanges. (``tier`` is the old name of ``depth``, still accepted.)"""
        return views.read_topic(memory, uid, topic_id, tier if tier is not None and depth == 0 else depth)

    @server.tool(annotations=destructive)
    @errors
    def forget(exchange_id: str | None = None, topic_id: str | None = None,
               confirm: bool = False) -> dict[str, Any]:
        """Permanently delete one exchange (exchange_id), or every exchange filed under a topic
        or theme (topic_id), from memory and all its indexes. Returns the ids deleted.
        A theme holding several topics is not deleted without confirm=true: the answer is then
        a preview (deleted is empty) listing exactly the exchanges and topics that would go;
        show it to the user and call again with confirm=true only if they agree."""
        if (exchange_id is None) == (topic_id is None):
            raise ValidationError("pass exactly one of exchange_id and topic_id")
        if exchange_id is not None:
            if confirm:
                raise ValidationError("confirm applies to topic_id only")
            memory.delete(exchange_id, user_id=uid)
            return {"deleted": [exchange_id]}
        assert topic_id is not None
        try:
            report = memory.forget_topic(topic_id, user_id=uid, confirm=confirm)
        except ConfirmationRequired as exc:
            return {"deleted": [], "confirmation_required": True, "message": str(exc),
                    "preview": _forget_view(exc.report)}
        return {"deleted": list(report.exchange_ids), "topic": _forget_view(report)}

    return server


def _forget_view(report: ForgetReport) -> dict[str, Any]:
    """A forget report for the model: what goes (or would go), and the counts."""
    return {"topic_id": report.topic_id, "kind": report.kind, "path": list(report.path),
            "exchange_ids": list(report.exchange_ids), "seqs": list(report.seqs),
            "exchanges": report.exchange_count, "topics": report.topic_count,
            "removed_topic_ids": list(report.removed_topic_ids), "applied": report.applied}


def http_app(memory: Memory, user_id: str, tokens: TokenPolicy | None, *, host: str = "127.0.0.1") -> Any:
    """The streamable-HTTP MCP app (``/mcp``) for ``user_id``, behind the HTTP API's token
    policy (``auth.BearerGuard``): a request needs a bearer token that may access
    ``user_id``. ``tokens=None`` serves without authentication (``--no-auth``, loopback)."""
    app = create_server(memory, user_id).streamable_http_app(host=host)
    return app if tokens is None else BearerGuard(app, tokens, user_id)


def run(memory: Memory, user_id: str, *, http: bool = False, host: str = "127.0.0.1",
        port: int = 8765, tokens: TokenPolicy | None = None) -> None:
    """Serve over stdio (default) or streamable HTTP at ``http://host:port/mcp`` (with
    ``tokens`` required on every request unless None)."""
    if not http:
        create_server(memory, user_id).run()
        return
    import uvicorn

    config = uvicorn.Config(http_app(memory, user_id, tokens, host=host), host=host, port=port, log_level="warning")
    uvicorn.Server(config).run()


__all__ = ["create_server", "http_app", "run", "INSTRUCTIONS"]
