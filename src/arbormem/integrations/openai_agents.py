"""An OpenAI Agents SDK ``Session`` whose history lives in arbormem.

``ArbormemSession(memory, user_id, session_id)`` implements the SDK's session protocol
(``session_id``, ``get_items(limit)``, ``add_items(items)``, ``pop_item()``,
``clear_session()``), so ``Runner.run(agent, text, session=session)`` keeps the
conversation in arbormem: each user turn becomes one exchange (the user's message, tool calls
and outputs, the assistant's reply, verbatim, in order) filed into the topic tree and
recallable in later sessions. ``await memory_context(text)`` (a coroutine, like the Session
methods; ``memory_context_sync`` for sync code) returns the recall for a message, to put in
the agent's instructions.

Mapping: items with a ``role`` are stored as messages as they are; role-less items
(function calls, their outputs, reasoning) are stored as ``{"role": "tool", "content":
<short text>, "agents_item": <the item>}`` and given back unchanged. A turn whose reply has not
arrived yet is a *pending* exchange (never recalled); when the rest of the turn arrives the
exchange is rewritten as a completed one with the same time. ``get_items`` returns exactly
what was added, in order (the test suite checks the round trip through a real ``Runner``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

try:
    from agents.memory.session import SessionABC
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("ArbormemSession needs the OpenAI Agents SDK: pip install 'arbormem[integrations]'") from exc

from ..memory import Memory
from ..models import Exchange, Recall
from ..render import message_text
from ..validate import ROLES
from ..validate import session_id as check_session
from ..validate import user_id as check_user

META = "agents_session"


def _to_message(item: Mapping[str, Any]) -> dict[str, Any]:
    item = json.loads(json.dumps(dict(item), default=str))
    if item.get("role") in ROLES and (item.get("content") is None or isinstance(item.get("content"), (str, list))):
        return dict(item)
    kind = str(item.get("type", "item"))
    summary = item.get("name") or item.get("output") or item.get("arguments") or ""
    text = f"[{kind}] {summary if isinstance(summary, str) else json.dumps(summary)}"[:2000]
    return {"role": "tool", "content": text, "agents_item": item}


def _to_item(msg: Mapping[str, Any]) -> dict[str, Any]:
    if "agents_item" in msg:
        return dict(msg["agents_item"])
    return dict(msg)


def _is_user(msg: Mapping[str, Any]) -> bool:
    return msg.get("role") == "user" and "agents_item" not in msg and bool(message_text(msg).strip())


class ArbormemSession(SessionABC):
    """Conversation history of one agents session, stored as arbormem exchanges."""

    def __init__(self, memory: Memory, user_id: str, session_id: str) -> None:
        self.memory = memory
        self.user_id = check_user(user_id)
        sid = check_session(session_id)
        if not sid:
            raise ValueError("session_id must be a non-empty string")
        self.session_id: str = sid
        self.session_settings = None

    # -- storage (sync; the protocol methods run them in a worker thread) -------------------
    def _exchanges(self) -> list[Exchange]:
        return [e for e in self.memory.store.iter_exchanges(self.user_id)
                if e.session_id == self.session_id and e.metadata.get(META) == self.session_id
                and e.status in ("pending", "completed")]

    def _store(self, messages: list[dict[str, Any]], at: Any = None) -> None:
        """Store one turn (starts with a user message): pending while only user input."""
        meta = {META: self.session_id}
        if all(m.get("role") == "user" for m in messages) and len(messages) == 1:
            self.memory.begin(message_text(messages[0]), user_id=self.user_id, session_id=self.session_id,
                              at=at, metadata={**meta, "agents_messages": messages})
        else:
            self.memory.add(messages, user_id=self.user_id, session_id=self.session_id, at=at, metadata=meta)

    @staticmethod
    def _messages(ex: Exchange) -> list[dict[str, Any]]:
        kept = ex.metadata.get("agents_messages")
        return [dict(m) for m in (kept if isinstance(kept, list) else ex.messages)]

    def _add(self, items: Sequence[Mapping[str, Any]]) -> None:
        msgs = [_to_message(i) for i in items]
        if not msgs:
            return
        with self.memory.store.transaction(self.user_id):
            turns: list[list[dict[str, Any]]] = []
            for m in msgs:
                if _is_user(m) or not turns:
                    turns.append([m])
                else:
                    turns[-1].append(m)
            first = turns[0]
            if not _is_user(first[0]):
                # The rest of the last turn (tool calls, the reply): rewrite that exchange.
                history = self._exchanges()
                if history:
                    last = history[-1]
                    self.memory.delete(last.id, user_id=self.user_id)
                    self._store(self._messages(last) + first, at=last.user_at)
                    turns = turns[1:]
                else:  # no user message at all yet: keep the items under an empty user turn
                    turns[0] = [{"role": "user", "content": "(session start)"}, *first]
            for turn in turns:
                self._store(turn)

    def _get(self, limit: int | None) -> list[dict[str, Any]]:
        items = [_to_item(m) for ex in self._exchanges() for m in self._messages(ex)
                 if not (m.get("content") == "(session start)" and m.get("role") == "user")]
        return items if limit is None else items[-limit:] if limit > 0 else []

    def _pop(self) -> dict[str, Any] | None:
        with self.memory.store.transaction(self.user_id):
            history = self._exchanges()
            if not history:
                return None
            last = history[-1]
            msgs = self._messages(last)
            popped = msgs.pop()
            self.memory.delete(last.id, user_id=self.user_id)
            if msgs and _is_user(msgs[0]):
                self._store(msgs, at=last.user_at)
            return _to_item(popped)

    def _clear(self) -> None:
        with self.memory.store.transaction(self.user_id):
            for ex in self._exchanges():
                self.memory.delete(ex.id, user_id=self.user_id)

    # -- the Session protocol ---------------------------------------------------------------
    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The session's items in order (the last ``limit`` when given)."""
        return await asyncio.to_thread(self._get, limit)

    async def add_items(self, items: list[Any]) -> None:
        """Append items; a user message starts a new exchange in the tree."""
        await asyncio.to_thread(self._add, items)

    async def pop_item(self) -> Any | None:
        """Remove and return the most recent item."""
        return await asyncio.to_thread(self._pop)

    async def clear_session(self) -> None:
        """Delete every exchange of this session (other sessions of the user are kept)."""
        await asyncio.to_thread(self._clear)

    # -- beyond the protocol ----------------------------------------------------------------
    async def memory_context(self, text: str, max_tokens: int = 1024) -> Recall:
        """A coroutine (like the Session methods): the recall over all of the user's memory
        (every session) for a new message; put ``(await session.memory_context(msg)).text`` in
        the agent's instructions. ``memory_context_sync`` is the same for sync code."""
        return await asyncio.to_thread(self.memory_context_sync, text, max_tokens)

    def memory_context_sync(self, text: str, max_tokens: int = 1024) -> Recall:
        """``memory_context`` for code without an event loop."""
        return self.memory.recall(text, user_id=self.user_id, max_tokens=max_tokens)


__all__ = ["ArbormemSession"]
