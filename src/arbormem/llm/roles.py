"""The LLM roles: one pydantic schema, one prompt and one function each.

Every function takes an ``LLMRunner`` plus plain data (``Turn``, ``TopicCard``) and returns a
typed, validated result or None. None always means "use the offline path for this step"; the
reason is in ``runner.log()``.

Roles (and the seed they come from):
- ``label_topic``     titler/summariser: title, keywords, retrieval terms, trigger, summary
                      of a frozen topic (TRACE summaries, CoMeT trigger, Topic Memory terms).
- ``detail_topic``    the lazy detailed summary, depth 1 (CoMeT); the caller caches it.
- ``route``           continue the current topic or open a new one under which ancestor
                      (TRACE's classifier).
- ``segment``         Topic Memory's worker over the open tail, with open/provisional/
                      finalized spans; bounded input, validated coverage.
- the recall planner (``retrieve/llm_plan.py``) analyses the query and selects topics in one
  call (CoMeT, LongMemEval, Topic Memory's selector), over ``QueryPlan`` and ``handles``.
- ``veto_merge``      confirms or rejects a proposed merge (TRACE axiom 4), neutral prompt.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from datetime import date, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from . import prompts
from .prompts import Budget, TopicCard, Turn
from .runner import LLMRunner
from .validate import Grounding, InvalidOutput, prompt_wording

# -- text hygiene shared by every schema ----------------------------------------------------
_PLACEHOLDER = re.compile(r"^\s*(<[^<>]*>|\.\.\.|…|n/?a|null|none|string|todo)\s*$", re.IGNORECASE)


def _clean(value: str) -> str:
    """Collapse whitespace; reject control characters and echoed placeholders."""
    if any(unicodedata.category(ch) == "Cc" and ch not in "\n\t" for ch in value):
        raise ValueError("contains control characters")
    value = " ".join(value.split())
    if not value:
        raise ValueError("is empty")
    if _PLACEHOLDER.match(value):
        raise ValueError("is a placeholder, not content")
    return value


def _terms(values: list[str], limit: int) -> list[str]:
    """Clean a list of short terms, drop duplicates (case-insensitive), keep at most ``limit``.

    Dropping extras and duplicates only removes what the model said; it never invents.
    """
    out: list[str] = []
    seen: set[str] = set()
    for raw in values:
        try:
            term = _clean(raw)
        except ValueError:
            continue
        if len(term) > 60:
            raise ValueError("a term is longer than 60 characters")
        key = term.casefold()
        if key not in seen:
            seen.add(key)
            out.append(term)
    return out[:limit]


_OPTIONAL_TEXT = frozenset({"new_topic_title", "trigger", "reason", "time_range"})

Title = Annotated[str, Field(min_length=1, max_length=120), AfterValidator(_clean)]
Sentence = Annotated[str, Field(min_length=1, max_length=400), AfterValidator(_clean)]
Paragraph = Annotated[str, Field(min_length=1, max_length=1200), AfterValidator(_clean)]


class _Schema(BaseModel):
    # Models add keys of their own; those are ignored, missing or mistyped keys are not.
    model_config = ConfigDict(extra="ignore", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _blank_is_null(cls, data: object) -> object:
        # "" for an optional field means "nothing", as null does; required fields still fail.
        if isinstance(data, dict):
            return {k: (None if isinstance(v, str) and not v.strip() and k in _OPTIONAL_TEXT else v)
                    for k, v in data.items()}
        return data


# -- labeler ------------------------------------------------------------------------------------
class TopicLabel(_Schema):
    """Title, keywords, retrieval terms, trigger and summary of one topic."""

    title: Title
    keywords: list[str] = Field(min_length=1)
    retrieval_terms: list[str] = Field(default_factory=list)
    trigger: Sentence | None = None
    summary: Paragraph

    @field_validator("keywords")
    @classmethod
    def _kw(cls, v: list[str]) -> list[str]:
        out = _terms(v, 8)
        if not out:
            raise ValueError("no usable keyword")
        return out

    @field_validator("retrieval_terms")
    @classmethod
    def _rt(cls, v: list[str]) -> list[str]:
        return _terms(v, 12)


def turns_text(turns: Sequence[Turn]) -> str:
    """The exchanges' own words: what a label of them may draw names and numbers from."""
    return "\n".join(f"{t.user}\n{t.assistant}" for t in turns)


def check_label(label: TopicLabel, ground: Grounding) -> TopicLabel:
    """Reject a label whose title or summary is junk (``Grounding.junk``: a prompt handle,
    marker or phrase, a JSON or markup fragment, a number or month the topic never states, a
    generic one-word title); drop junk keywords, retrieval terms and trigger (dropping only
    removes what the model said), and reject the label when no keyword is left."""
    for kind, text in (("title", label.title), ("sentence", label.summary)):
        why = ground.junk(text, kind)
        if why is not None:
            raise InvalidOutput(f"{'title' if kind == 'title' else 'summary'} {why}")
    keywords = [k for k in label.keywords if ground.junk(k, "term") is None]
    if not keywords:
        raise InvalidOutput(f"no keyword left after dropping junk: {label.keywords[:8]!r}")
    terms_ = [t for t in label.retrieval_terms if ground.junk(t, "term") is None]
    trigger = label.trigger if label.trigger and ground.junk(label.trigger, "sentence") is None else None
    return label.model_copy(update={"keywords": keywords, "retrieval_terms": terms_, "trigger": trigger})


def label_topic(runner: LLMRunner, turns: Sequence[Turn], budget: Budget | None = None, *,
                deadline: float | None = None) -> TopicLabel | None:
    """Title/keywords/terms/trigger/summary for a topic's exchanges (sampled, bounded)."""
    if not turns:
        return None
    msgs = prompts.label_messages(turns, budget or Budget())
    ground = Grounding(turns_text(turns), prompt_wording(msgs))
    return runner.run("labeler", msgs, TopicLabel, check=lambda label: check_label(label, ground),
                      deadline=deadline)


class _RawBatch(_Schema):
    topics: list[dict[str, Any]] = Field(min_length=1)


class TopicLabels(_Schema):
    """Labels of a batch, by topic id; ``rejected`` counts items that failed validation."""

    labels: dict[str, TopicLabel]
    rejected: int = 0


def label_topics(
    runner: LLMRunner,
    topics: Sequence[tuple[str, Sequence[Turn]]],
    budget: Budget | None = None,
    *,
    max_turns: int = 6,
    deadline: float | None = None,
) -> TopicLabels | None:
    """Labels for up to a handful of topics in ONE call (amortises the organiser's cost).

    Each item is validated on its own: a well-labelled topic is kept even if another item of
    the batch is unusable (that topic keeps its offline labels and is retried later). Items
    naming an unknown or repeated handle are rejected, and so are items whose text is junk
    (``check_label``, grounded in that topic's own exchanges); a batch with no valid item is
    None.
    """
    table = [(f"T{i + 1}", tid, turns) for i, (tid, turns) in enumerate(topics) if turns]
    if not table:
        return None
    ids = {h.casefold(): tid for h, tid, _ in table}
    msgs = prompts.label_batch_messages([(h, turns) for h, _, turns in table], budget or Budget(), max_turns=max_turns)
    wording = prompt_wording(msgs)
    grounds = {tid: Grounding(turns_text(turns), wording) for _, tid, turns in table}
    reasons: list[str] = []

    def check(raw: _RawBatch) -> TopicLabels:
        labels: dict[str, TopicLabel] = {}
        rejected = 0
        for item in raw.topics:
            key = str(item.get("id", "")).strip().casefold() if isinstance(item, dict) else ""
            tid = ids.get(key)
            if tid is None or tid in labels:
                rejected += 1
                continue
            try:
                labels[tid] = check_label(TopicLabel.model_validate(item), grounds[tid])
            except (ValueError, InvalidOutput) as exc:  # a schema error, or junk text
                rejected += 1
                reasons.append(str(exc).splitlines()[0][:160])
        if not labels:
            why = f": {reasons[0]}" if reasons else ""
            raise InvalidOutput(f"no valid label among {len(raw.topics)} items{why}")
        return TopicLabels(labels=labels, rejected=rejected)

    return runner.run("labeler", msgs, _RawBatch, max_tokens=220 * len(table) + 100, check=check,
                      deadline=deadline)


class DetailedSummary(_Schema):
    detail: Annotated[str, Field(min_length=1, max_length=2500), AfterValidator(_clean)]


def detail_topic(runner: LLMRunner, title: str, turns: Sequence[Turn], budget: Budget | None = None) -> DetailedSummary | None:
    """The depth-1 detailed summary (3-8 sentences). Callers cache it; it is made on demand."""
    if not turns:
        return None
    msgs = prompts.detail_messages(title, turns, budget or Budget())
    ground = Grounding(turns_text(turns), prompt_wording(msgs))

    def check(d: DetailedSummary) -> DetailedSummary:
        why = ground.junk(d.detail, "sentence")
        if why is not None:
            raise InvalidOutput(f"detail {why}")
        return d

    return runner.run("detail", msgs, DetailedSummary, check=check)


# -- router -------------------------------------------------------------------------------------
class RouteDecision(_Schema):
    continue_current: bool
    new_topic_title: Title | None = None
    parent_index: int | None = Field(default=None, ge=0)


def route(
    runner: LLMRunner,
    current: TopicCard | None,
    ancestors: Sequence[TopicCard],
    recent: Sequence[Turn],
    new: Turn,
    budget: Budget | None = None,
    *,
    deadline: float | None = None,
) -> RouteDecision | None:
    """Continue the current topic, or open a new one under ancestor ``parent_index``."""
    msgs = prompts.route_messages(current, ancestors, recent, new, budget or Budget())
    ground = Grounding(turns_text([*recent, new]), prompt_wording(msgs))

    def check(d: RouteDecision) -> RouteDecision:
        if d.continue_current and current is None:
            raise InvalidOutput("continue_current without a current topic")
        if not d.continue_current and d.parent_index is not None and d.parent_index >= len(ancestors):
            raise InvalidOutput(f"parent_index {d.parent_index} is not an ancestor")
        if d.new_topic_title is not None:
            why = ground.junk(d.new_topic_title, "title")
            if why is not None:
                raise InvalidOutput(f"new_topic_title {why}")
        return d

    return runner.run("router", msgs, RouteDecision, check=check, deadline=deadline)


# -- segmenter ----------------------------------------------------------------------------------
SpanStatus = Literal["open", "provisional", "finalized"]


class Segment(_Schema):
    start_seq: int
    end_seq: int
    status: SpanStatus
    label_terms: list[str] = Field(min_length=1)
    retrieval_terms: list[str] = Field(default_factory=list)

    @field_validator("label_terms")
    @classmethod
    def _lt(cls, v: list[str]) -> list[str]:
        out = _terms(v, 5)
        if not out:
            raise ValueError("no usable label term")
        return out

    @field_validator("retrieval_terms")
    @classmethod
    def _rt(cls, v: list[str]) -> list[str]:
        return _terms(v, 12)

    @model_validator(mode="after")
    def _order(self) -> Segment:
        if self.end_seq < self.start_seq:
            raise ValueError("end_seq before start_seq")
        return self


class Segmentation(_Schema):
    topics: list[Segment] = Field(min_length=1)


def check_segmentation(seg: Segmentation, seqs: Sequence[int], min_follow: int) -> Segmentation:
    """All-or-nothing checks a schema cannot express.

    The spans, in order, must cover exactly the given sequence numbers with no gap or
    overlap; a span may only be ``finalized`` when at least ``min_follow`` exchanges follow
    it (Topic Memory's rule), and only the last span may be ``open``.
    """
    order = sorted(seqs)
    position = {s: i for i, s in enumerate(order)}
    expected = 0
    for k, span in enumerate(seg.topics):
        if span.start_seq not in position or span.end_seq not in position:
            raise InvalidOutput(f"span {span.start_seq}-{span.end_seq} is outside the input")
        if position[span.start_seq] != expected:
            raise InvalidOutput(f"span {span.start_seq}-{span.end_seq} leaves a gap or overlaps")
        expected = position[span.end_seq] + 1
        following = len(order) - expected
        if span.status == "finalized" and following < min_follow:
            raise InvalidOutput(f"span ending at {span.end_seq} finalized with only {following} exchanges after it")
        if span.status == "open" and k != len(seg.topics) - 1:
            raise InvalidOutput("only the last span may be open")
    if expected != len(order):
        raise InvalidOutput("the spans do not cover every exchange")
    return seg


def segment(
    runner: LLMRunner,
    turns: Sequence[Turn],
    *,
    max_turns: int = 24,
    min_follow: int = 4,
    budget: Budget | None = None,
    deadline: float | None = None,
) -> Segmentation | None:
    """Split the open tail into spans. Input is bounded to the last ``max_turns`` turns.

    The caller runs this only when new exchanges arrived since the last run and passes only
    turns after the last finalized span, so the prompt never grows with the history and
    finalized topics are never rebuilt; ``stable_assignment`` maps the spans to existing
    topic ids.
    """
    window = list(turns)[-max_turns:]
    if not window:
        return None
    msgs = prompts.segment_messages(window, budget or Budget())
    ground = Grounding(turns_text(window), prompt_wording(msgs))

    def check(seg: Segmentation) -> Segmentation:
        checked = check_segmentation(seg, [t.seq for t in window], min_follow)
        spans = []
        for span in checked.topics:
            # The terms may name a new topic: junk ones go, a span left with none is rejected.
            label_terms = [t for t in span.label_terms if ground.junk(t, "term") is None]
            if not label_terms:
                raise InvalidOutput(f"span {span.start_seq}-{span.end_seq}: no label term left after dropping junk")
            retrieval = [t for t in span.retrieval_terms if ground.junk(t, "term") is None]
            spans.append(span.model_copy(update={"label_terms": label_terms, "retrieval_terms": retrieval}))
        return checked.model_copy(update={"topics": spans})

    return runner.run("segmenter", msgs, Segmentation, check=check, deadline=deadline)


def stable_assignment(
    segmentation: Segmentation, existing: Sequence[tuple[str, int, int]]
) -> list[tuple[str | None, Segment]]:
    """Give each new span the id of the existing open topic it overlaps most (ids stay stable).

    ``existing`` holds (topic_id, start_seq, end_seq) of the tail's current topics. Each
    existing id is used at most once; a span with no overlapping topic gets None (new topic).
    Topic Memory rebuilt open topics on every run, so their ids changed; this keeps them.
    """
    used: set[str] = set()
    out: list[tuple[str | None, Segment]] = []
    for span in segmentation.topics:
        best: tuple[int, str] | None = None
        for tid, start, end in existing:
            if tid in used:
                continue
            overlap = min(end, span.end_seq) - max(start, span.start_seq) + 1
            if overlap > 0 and (best is None or overlap > best[0]):
                best = (overlap, tid)
        if best is not None:
            used.add(best[1])
        out.append((best[1] if best else None, span))
    return out


# -- topic handles (the planner's directory) ------------------------------------------------------
def handles(directory: Sequence[TopicCard]) -> list[tuple[str, TopicCard]]:
    """Short handles (T1, T2, ...) for directory entries: models copy them more reliably
    than long ids, and an invented handle is easy to detect."""
    return [(f"T{i + 1}", card) for i, card in enumerate(directory)]


def resolve_handles(ids: Sequence[str], table: Sequence[tuple[str, TopicCard]], limit: int) -> list[str]:
    """Map handles back to topic ids; reject unknown handles, drop repeats, keep ``limit``."""
    lookup = {h.casefold(): card.id for h, card in table}
    out: list[str] = []
    for raw in ids:
        key = str(raw).strip().casefold()
        if key not in lookup:
            raise InvalidOutput(f"unknown topic handle {raw!r}")
        if lookup[key] not in out:
            out.append(lookup[key])
    return out[:limit]


# -- query plan -----------------------------------------------------------------------------
Intent = Literal["fact", "event", "preference", "overview", "recent", "none"]


class TimeRange(_Schema):
    start: date
    end: date

    @model_validator(mode="after")
    def _order(self) -> TimeRange:
        if self.end < self.start:
            raise ValueError("time_range ends before it starts")
        return self


class QueryPlan(_Schema):
    """The query part of a recall plan: semantic query, intent, time range."""

    semantic_query: Annotated[str, Field(min_length=1, max_length=500), AfterValidator(_clean)]
    intent: Intent = "fact"
    time_range: TimeRange | None = None


def check_time_range(rng: TimeRange | None, now: datetime) -> None:
    """A model's date arithmetic must land in a plausible window around now."""
    if rng is None:
        return
    if rng.start.year < now.year - 100 or rng.end > date(now.year + 1, 12, 31):
        raise InvalidOutput(f"implausible time range {rng.start}..{rng.end}")


# -- veto ---------------------------------------------------------------------------------------
class MergeVerdict(_Schema):
    same_topic: bool
    reason: Sentence | None = None


def veto_merge(
    runner: LLMRunner,
    a: TopicCard,
    a_turns: Sequence[Turn],
    b: TopicCard,
    b_turns: Sequence[Turn],
    budget: Budget | None = None,
) -> MergeVerdict | None:
    """Confirm (``same_topic=True``) or reject a proposed merge. None = no verdict: callers
    must then keep the topics apart (merges are the one step where doing nothing is safe)."""
    msgs = prompts.veto_messages(a, a_turns, b, b_turns, budget or Budget())
    return runner.run("veto", msgs, MergeVerdict)


__all__ = [
    "TopicLabel",
    "DetailedSummary",
    "RouteDecision",
    "Segment",
    "Segmentation",
    "TimeRange",
    "QueryPlan",
    "MergeVerdict",
    "Intent",
    "label_topic",
    "label_topics",
    "TopicLabels",
    "check_label",
    "turns_text",
    "detail_topic",
    "route",
    "segment",
    "check_segmentation",
    "stable_assignment",
    "handles",
    "resolve_handles",
    "check_time_range",
    "veto_merge",
]
