"""Typed results of the consolidation organiser (frozen dataclasses, as in ``models.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from ..models import Exchange, Serializable, Topic

RecallMode = Literal["active", "passive", "both"]


@dataclass(frozen=True)
class ConsolidationReport(Serializable):
    """What one ``consolidate`` run did for one user.

    ``merged``/``linked`` count topic pairs; ``archived``/``deduplicated``/``superseded``
    count exchanges; ``tagged`` counts topics whose tags were (re)normalised; ``rehomed``
    counts top-level strays moved into a branch (a namesake, a short topic: docs/tree.md,
    "Short returns"); ``skipped``
    counts merge candidates kept apart (veto, changed while the LLM was thinking, size cap);
    ``changes`` are the ids of the change-log rows written (each one ``undo``-able when it is
    a merge or an archive). ``duration`` is in seconds.
    """

    user_id: str
    candidates: int = 0
    merged: int = 0
    linked: int = 0
    archived: int = 0
    superseded: int = 0
    deduplicated: int = 0
    tagged: int = 0
    rehomed: int = 0
    skipped: int = 0
    vetoed: int = 0
    llm_calls: int = 0
    duration: float = 0.0
    changes: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Change(Serializable):
    """One logged tree change, as ``Memory.history`` returns it."""

    id: str
    user_id: str
    at: datetime
    action: str
    target_id: str
    detail: dict[str, Any] = field(default_factory=dict)
    undone: bool = False


@dataclass(frozen=True)
class TopicReading(Serializable):
    """A topic read at one of three depths (``Memory.read``).

    depth 0: ``text`` is the title and short summary; depth 1: a detailed summary (from the
    LLM when configured, else extractive; cached until the topic changes), ``source`` says
    which; depth 2: ``exchanges`` holds the verbatim exchanges (archived ones included, marked
    by their flag) and ``text`` renders them.
    """

    topic: Topic
    depth: int
    text: str
    source: str
    recall_mode: RecallMode = "active"
    tags: tuple[str, ...] = ()
    links: tuple[str, ...] = ()
    exchanges: tuple[Exchange, ...] = ()


__all__ = ["ConsolidationReport", "Change", "TopicReading", "RecallMode"]
