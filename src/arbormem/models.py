"""Typed, immutable results returned by arbormem.

All public results are frozen dataclasses. ``to_dict()`` gives a JSON-ready view for the CLI
and HTTP layers (datetimes as ISO 8601 strings).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

# A runtime import (not TYPE_CHECKING): the HTTP layer builds its schema from these types.
from .llm.runner import LLMUsage

Status = Literal["pending", "completed", "failed"]
TopicKind = Literal["root", "theme", "topic"]
Message = Mapping[str, Any]


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


class Serializable:
    def to_dict(self) -> dict[str, Any]:
        out = _jsonable(self)
        assert isinstance(out, dict)
        return out


def exchange_text(user_text: str, assistant_text: str) -> str:
    """An exchange's two texts as one string (``Exchange.text``: what is embedded and indexed)."""
    return f"{user_text}\n{assistant_text}" if assistant_text else user_text


@dataclass(frozen=True)
class Exchange(Serializable):
    """One user message and the assistant's reply (plus optional system/tool messages).

    The verbatim ``messages`` are the source of truth; ``user_text`` / ``assistant_text`` are
    the concatenated contents of the user and assistant messages (each as ``"name: content"``
    when the message carries an OpenAI-style participant ``name``).
    """

    id: str
    user_id: str
    session_id: str | None
    seq: int
    status: Status
    messages: tuple[Mapping[str, Any], ...]
    user_text: str
    assistant_text: str
    user_at: datetime
    assistant_at: datetime | None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    topic_id: str | None = None
    failure: str | None = None
    archived: bool = False

    @property
    def text(self) -> str:
        """User and assistant text as one string (what gets embedded and indexed)."""
        return exchange_text(self.user_text, self.assistant_text)


@dataclass(frozen=True)
class Topic(Serializable):
    """A node of the topic tree.

    ``kind`` is ``"topic"`` for a leaf holding a run of exchanges, ``"theme"`` for an inner node
    grouping related topics, ``"root"`` for the per-user root returned by ``Memory.tree``.
    ``path`` holds the titles from the top-level theme down to this node.
    """

    id: str
    user_id: str
    kind: TopicKind
    parent_id: str | None
    title: str
    keywords: tuple[str, ...]
    summary: str
    start_seq: int | None
    end_seq: int | None
    size: int
    first_at: datetime | None
    last_at: datetime | None
    frozen: bool
    depth: int = 0
    path: tuple[str, ...] = ()
    children: tuple[Topic, ...] = ()

    @property
    def path_text(self) -> str:
        return " › ".join(self.path)

    def walk(self) -> list[Topic]:
        """This node and all its descendants, depth first."""
        out = [self]
        for child in self.children:
            out.extend(child.walk())
        return out

    def height(self) -> int:
        """Number of levels below and including this node."""
        return 1 + max((c.height() for c in self.children), default=0)


@dataclass(frozen=True)
class Hit(Serializable):
    """One ranked search result: an exchange with its fused score and topic path."""

    exchange: Exchange
    score: float
    topic_id: str | None
    path: tuple[str, ...]
    # Why it is a candidate: "dense", "lexical" (the indexes that returned it), "time" (inside
    # the query's time window), "neighbour" (fetched beside a strong hit), "feedback" (lifted
    # by the best hits' terms; retrieve/engine.py).
    sources: tuple[str, ...] = ()
    # Calibrated relevance to the query (dense cosine + a share of the query's terms one
    # message holds): comparable across queries and memories, unlike ``score``; the
    # relevance floor reads it (docs/recall.md, "Relevance floor").
    relevance: float = 0.0


@dataclass(frozen=True)
class RecallTrace(Serializable):
    """Why a recall returned what it did: candidate counts, chosen items, timings (ms)."""

    query_terms: tuple[str, ...]
    candidates: int
    topic_scores: Mapping[str, float]
    exchange_scores: Mapping[str, float]
    timings_ms: Mapping[str, float]
    budget: int
    dropped: int
    notes: tuple[str, ...] = ()
    #: The relevance floor applied (0: off), the best candidate's relevance, how many
    #: candidates the floor left out, and where and why packing stopped (docs/recall.md).
    min_relevance: float = 0.0
    best_relevance: float = 0.0
    below_floor: int = 0
    stopped: str = ""


@dataclass(frozen=True)
class Recall(Serializable):
    """The memory context for one new user message.

    ``text`` is ready to inject; ``tokens`` is its cl100k token count and never exceeds the
    requested budget. ``exchanges`` lists every exchange whose verbatim text is in ``text``.
    """

    text: str
    tokens: int
    exchanges: tuple[Exchange, ...]
    topics: tuple[Topic, ...]
    trace: RecallTrace


@dataclass(frozen=True)
class Stats(Serializable):
    user_id: str | None
    exchanges: int
    completed: int
    pending: int
    failed: int
    topics: int
    themes: int
    depth: int
    transcript_tokens: int
    #: Topics whose title, keywords and summary came from the LLM (the rest are offline).
    llm_labelled: int = 0
    #: This process's LLM calls (sent, ok, invalid, timed out, errors; skipped and why);
    #: None without an LLM.
    llm: LLMUsage | None = None


@dataclass(frozen=True)
class ReembedProgress(Serializable):
    """Where a re-embed stands, passed to its ``progress`` callback after every batch:
    ``done`` of the user's ``total`` exchange vectors are rewritten (not yet committed)."""

    user_id: str
    done: int
    total: int


@dataclass(frozen=True)
class ReembedReport(Serializable):
    """What ``Memory.reembed`` did.

    ``embedder`` is the new model as recorded (``NAME:DIM``), ``previous`` the one recorded
    before. ``users`` were re-embedded by this call, ``skipped`` were already done by an
    earlier, interrupted call, ``pending`` still hold vectors of the previous model.
    ``complete`` is True once every user is done and the memory records the new embedder
    (until then, reads and writes refuse the memory). ``aliases_dropped`` counts merged
    topics' part vectors (organize/consolidate.py), which cannot be rebuilt and are removed.
    """

    embedder: str
    previous: str | None
    users: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()
    exchanges: int = 0
    topics: int = 0
    aliases_dropped: int = 0
    complete: bool = False
    seconds: float = 0.0


@dataclass(frozen=True)
class ForgetReport(Serializable):
    """What ``Memory.forget_topic`` deletes (``applied``) or would delete (a preview).

    ``exchange_ids`` / ``seqs`` are exactly the exchanges filed under the node (every topic
    below a theme), in sequence order; ``topic_count`` is the number of topics (leaves) among
    them, ``removed_topic_ids`` every theme and topic that goes, including a parent theme left
    empty. ``confirm_required`` is True for a theme holding more than one topic: it is only
    deleted with ``confirm=True``.
    """

    topic_id: str
    kind: TopicKind
    title: str
    path: tuple[str, ...]
    exchange_ids: tuple[str, ...]
    seqs: tuple[int, ...]
    exchange_count: int
    topic_count: int
    removed_topic_ids: tuple[str, ...]
    confirm_required: bool
    applied: bool


@dataclass(frozen=True)
class SkippedItem(Serializable):
    """An import item that was not stored: ``index`` (0-based, in the items given) repeats
    the stored exchange ``exchange_id``."""

    index: int
    exchange_id: str


@dataclass(frozen=True)
class ImportReport(Serializable):
    """What ``Memory.import_exchanges`` did: the exchanges stored now (``added``) and the
    items skipped because the memory already held them (``skipped``)."""

    added: tuple[Exchange, ...] = ()
    skipped: tuple[SkippedItem, ...] = ()


__all__ = ["Exchange", "Topic", "Hit", "Recall", "RecallTrace", "Stats", "ReembedProgress",
           "ReembedReport", "ForgetReport", "ImportReport", "SkippedItem", "Status", "Message"]
