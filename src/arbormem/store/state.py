"""Typed state kept on stored rows: a topic's ``TopicMeta`` and an exchange's ``ExchangeMarks``.

Both are stored as JSON objects (the topic row's ``meta`` column; the ``"_arbormem"`` key of an
exchange's metadata) and cross the store boundary through one encoder and one decoder each:
``TopicMeta.decode`` / ``TopicMeta.encode`` and ``ExchangeMarks.of`` / ``ExchangeMarks.apply``.
Every other module reads and writes attributes, never string keys.

The stored shape is the one the untyped dicts had (same keys, same JSON types), so no
migration was needed: a field at its default is simply left out, as the old code popped a
key it emptied. Keys this version does not know (written by a newer one) are kept in
``extra`` and written back unchanged. A stored value of the wrong JSON type decodes to the
field's default (``arbormem check`` reports such rows).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The metadata key under which the organiser keeps its marks on exchanges (callers may not
#: set it: validate.py rejects it, so a forged mark cannot steer recall).
MARKS_KEY = "_arbormem"


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _int_map(v: Any) -> dict[str, int]:
    """A ``{str: int}`` object as stored, dropping entries of another type. Whole maps are
    checked in one pass first: phrase counts are decoded for every topic read, and a call
    per entry was most of what reading a theme cost."""
    if not isinstance(v, Mapping):
        return {}
    if all(type(x) is int for x in v.values()):
        return dict(v)
    return {k: x for k, x in v.items() if _int(x) is not None}


def no_merge_in(raw: Any) -> bool:
    """Whether a stored ``meta`` object carries a merge veto (``TopicMeta.no_merge``),
    without decoding the rest of it."""
    return isinstance(raw, Mapping) and bool(_strs(raw.get("no_merge")))


def _strs(v: Any) -> list[str]:
    return [x for x in v if isinstance(x, str)] if isinstance(v, list) else []


def _floats(v: Any) -> list[float]:
    return [float(x) for x in v if isinstance(x, (int, float)) and not isinstance(x, bool)] \
        if isinstance(v, list) else []


@dataclass
class RunMarks:
    """Consolidation's watermarks, kept on the root (``organize/consolidate.py``): the last
    sequence the topic and exchange passes have seen, the topics to re-examine (changed by
    the last run or left for later by a limit) and when the last run ended (epoch seconds)."""

    topics: int = 0
    exchanges: int = 0
    dirty: list[str] = field(default_factory=list)
    at: float | None = None

    @classmethod
    def decode(cls, raw: Any) -> RunMarks:
        if not isinstance(raw, Mapping):
            return cls()
        at = raw.get("at")
        return cls(topics=_int(raw.get("topics")) or 0, exchanges=_int(raw.get("exchanges")) or 0,
                   dirty=_strs(raw.get("dirty")), at=float(at) if isinstance(at, (int, float)) else None)

    def encode(self) -> dict[str, Any]:
        out: dict[str, Any] = {"topics": self.topics, "exchanges": self.exchanges, "dirty": list(self.dirty)}
        if self.at is not None:
            out["at"] = self.at
        return out


@dataclass
class TopicMeta:
    """What a topic row keeps besides its labels and aggregates, grouped by the module that
    owns each field. Root-only fields are marked (root).
    """

    # -- placement (organize/tree.py)
    current: str | None = None          # (root) the open topic
    session: str | None = None          # session id of the topic's latest exchange
    closing: bool = False               # its latest exchange closed it ("thanks, that's all")
    pending: str | None = None          # lookahead: the exchange not judged yet
    shift_p: list[float] = field(default_factory=list)  # the shift head's last judgements this session
    phrases: dict[str, int] = field(default_factory=dict)   # bounded phrase counter (titles)
    titled: tuple[int, int] | None = None  # (size, children) when the title was last computed
    # -- labels (organize/enrich.py: LLM labels; organize/reading.py: depth-1 detail)
    label_source: str | None = None     # "llm" when the LLM labelled it
    label_size: int | None = None       # size at which the labels were set
    retrieval_terms: list[str] = field(default_factory=list)
    trigger: str = ""
    detail: str | None = None           # the LLM's detailed summary, valid at ``detail_size``
    detail_size: int | None = None
    detail_x: str | None = None         # the extractive detailed summary, at ``detail_x_size``
    detail_x_size: int | None = None
    # -- consolidation (organize/consolidate.py, organize/aliases.py)
    links: list[str] = field(default_factory=list)      # related topics, both ways
    no_merge: list[str] = field(default_factory=list)   # topics it must never merge with (undone)
    absorbed: list[str] = field(default_factory=list)   # topics merged into it
    aliases: list[str] = field(default_factory=list)    # parts indexed under alias ids
    part_text: dict[str, str] = field(default_factory=dict)  # the parts' pre-merge labels
    tags: list[str] = field(default_factory=list)
    tags_size: int | None = None        # size at which ``tags`` were normalised
    consolidated: RunMarks | None = None  # (root) the run's watermarks
    stays: bool = False                 # a topic whose consolidation move was undone: left where it is
    # title keys it must not take: a bigger top-level namesake it was not joined to
    not_titled: list[str] = field(default_factory=list)
    # -- recall modes (organize/reading.py)
    recall_mode: str = "active"
    passive: list[str] = field(default_factory=list)    # (root) topics pinned passive/both
    # -- LLM segmentation (organize/segment.py)
    segmented_through: int = 0          # (root) last sequence the LLM finalised
    segment_status: str | None = None
    #: Keys this version does not know, kept as they were.
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def decode(cls, raw: Any) -> TopicMeta:
        """The typed view of a stored ``meta`` object (the one decoder)."""
        if not isinstance(raw, Mapping) or not raw:
            return cls()
        r = dict(raw)
        titled = r.pop("titled", None)
        phrases = r.pop("phrases", None)
        part_text = r.pop("part_text", None)
        return cls(
            current=_str(r.pop("current", None)),
            session=_str(r.pop("session", None)),
            closing=r.pop("closing", False) is True,
            pending=_str(r.pop("pending", None)),
            shift_p=_floats(r.pop("shift_p", None)),
            phrases=_int_map(phrases),
            titled=(int(titled[0]), int(titled[1]))
            if isinstance(titled, list) and len(titled) == 2 and all(_int(x) is not None for x in titled) else None,
            label_source=_str(r.pop("label_source", None)),
            label_size=_int(r.pop("label_size", None)),
            retrieval_terms=[str(t) for t in terms] if isinstance(terms := r.pop("retrieval_terms", None), list) else [],
            trigger=_str(r.pop("trigger", None)) or "",
            detail=_str(r.pop("detail", None)),
            detail_size=_int(r.pop("detail_size", None)),
            detail_x=_str(r.pop("detail_x", None)),
            detail_x_size=_int(r.pop("detail_x_size", None)),
            links=_strs(r.pop("links", None)),
            no_merge=_strs(r.pop("no_merge", None)),
            absorbed=_strs(r.pop("absorbed", None)),
            aliases=_strs(r.pop("aliases", None)),
            part_text={k: v for k, v in part_text.items() if isinstance(v, str)}
            if isinstance(part_text, Mapping) else {},
            tags=_strs(r.pop("tags", None)),
            tags_size=_int(r.pop("tags_size", None)),
            consolidated=RunMarks.decode(r.pop("consolidated")) if "consolidated" in r else None,
            stays=r.pop("stays", False) is True,
            not_titled=_strs(r.pop("not_titled", None)),
            recall_mode=_str(r.pop("recall_mode", None)) or "active",
            passive=_strs(r.pop("passive", None)),
            segmented_through=_int(r.pop("segmented_through", None)) or 0,
            segment_status=_str(r.pop("segment_status", None)),
            extra=r,
        )

    def encode(self) -> dict[str, Any]:
        """The stored ``meta`` object (the one encoder): fields at their default are left out."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if value == default:
                continue
            if isinstance(value, RunMarks):
                value = value.encode()
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, (list, dict)):
                value = type(value)(value)
            out[f.name] = value
        out.update(self.extra)
        return out

    def copy(self) -> TopicMeta:
        """An independent copy (no list or dict shared with this one)."""
        return TopicMeta.decode(self.encode())


@dataclass(frozen=True)
class ExchangeMarks:
    """The organiser's marks on one exchange (``metadata["_arbormem"]``): the older exchange
    it repeats (``duplicate_of``), the newer one that corrected it (``superseded_by``) and the
    older ones it corrected (``supersedes``)."""

    duplicate_of: str | None = None
    superseded_by: str | None = None
    supersedes: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, metadata: Mapping[str, Any] | None) -> ExchangeMarks:
        """The marks held in an exchange's metadata (the one decoder)."""
        raw = metadata.get(MARKS_KEY) if isinstance(metadata, Mapping) else None
        if not isinstance(raw, Mapping):
            return cls()
        r = dict(raw)
        return cls(duplicate_of=_str(r.pop("duplicate_of", None)),
                   superseded_by=_str(r.pop("superseded_by", None)),
                   supersedes=tuple(_strs(r.pop("supersedes", None))), extra=r)

    def encode(self) -> dict[str, Any]:
        """The stored marks object (the one encoder); empty when there is no mark."""
        out: dict[str, Any] = dict(self.extra)
        if self.duplicate_of:
            out["duplicate_of"] = self.duplicate_of
        if self.superseded_by:
            out["superseded_by"] = self.superseded_by
        if self.supersedes:
            out["supersedes"] = list(self.supersedes)
        return out

    def apply(self, metadata: Mapping[str, Any]) -> dict[str, Any]:
        """``metadata`` with these marks in place of its old ones (the key goes when empty)."""
        out = {k: v for k, v in metadata.items() if k != MARKS_KEY}
        marks = self.encode()
        if marks:
            out[MARKS_KEY] = marks
        return out


__all__ = ["MARKS_KEY", "ExchangeMarks", "RunMarks", "TopicMeta", "no_merge_in"]
