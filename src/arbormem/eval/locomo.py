"""LoCoMo loader: conversations, questions and the exchange units the evaluation ingests.

LoCoMo (Maharana et al., ACL 2024; snap-research/locomo, CC BY-NC 4.0) holds long two-person
conversations split into dated sessions, plus questions whose evidence is a list of turn ids
(``D3:7`` = session 3, turn 7). The evaluation turns every session into exchanges by pairing
consecutive turns (first turn as the "user" message, second as the "assistant" message), gives
each message its speaker as the participant ``name``, dates each exchange with its session's
date and stores the turn ids in the exchange metadata. LLM-made annotations (summaries,
observations, event lists) are never read: a real user's memory only has the dialogue.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import ImportFormatError

#: LoCoMo question categories; 5 (adversarial, unanswerable) is left out of scoring.
CATEGORIES: dict[int, str] = {
    1: "multi-hop",
    2: "temporal",
    3: "open-domain",
    4: "single-hop",
    5: "adversarial",
}
SCORED_CATEGORIES = (1, 2, 3, 4)

_SESSION_KEY = re.compile(r"session_(\d+)")
_DIA_ID = re.compile(r"D\d+:\d+")
_DATE_FORMATS = ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%I:%M%p on %d %B, %Y")


@dataclass(frozen=True)
class Turn:
    """One utterance: ``text`` is what the scorer looks for verbatim in a recalled context."""

    dia_id: str
    speaker: str
    text: str
    caption: str | None = None

    def content(self) -> str:
        """The message content: the text, and the shared photo's caption."""
        return f"{self.text} [shares a photo: {self.caption}]" if self.caption else self.text

    def render(self) -> str:
        """The turn as a line of transcript: ``speaker: content``."""
        return f"{self.speaker}: {self.content()}"


@dataclass(frozen=True)
class Session:
    number: int
    at: datetime
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class Question:
    question: str
    answer: str
    category: int
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class Unit:
    """One exchange to ingest: one or two consecutive turns of a session."""

    conversation: str
    session: int
    index: int
    at: datetime
    turns: tuple[Turn, ...]

    @property
    def dia_ids(self) -> tuple[str, ...]:
        return tuple(t.dia_id for t in self.turns)

    def messages(self) -> list[dict[str, str]]:
        """OpenAI-format messages: the first turn as ``user``, the second as ``assistant``, each
        with the speaker as the participant ``name`` (both speakers are people; arbormem indexes
        and renders ``speaker: content``, the same line the baselines see)."""
        roles = ("user", "assistant")
        return [{"role": roles[i], "name": t.speaker, "content": t.content()}
                for i, t in enumerate(self.turns)]

    def text(self) -> str:
        """The unit's text as flat baselines see it (same words the library stores)."""
        return "\n".join(t.render() for t in self.turns)


@dataclass(frozen=True)
class Conversation:
    """One LoCoMo conversation. ``id`` is the file stem (e.g. ``26``)."""

    id: str
    speakers: tuple[str, str]
    sessions: tuple[Session, ...]
    questions: tuple[Question, ...]
    skipped_questions: int = 0
    turn_index: dict[str, Turn] = field(default_factory=dict, compare=False, repr=False)

    @property
    def turns(self) -> list[Turn]:
        return [t for s in self.sessions for t in s.turns]

    def units(self) -> list[Unit]:
        """The exchanges to ingest, in order: consecutive turns of each session paired."""
        out: list[Unit] = []
        for s in self.sessions:
            for i in range(0, len(s.turns), 2):
                out.append(Unit(self.id, s.number, len(out), s.at, tuple(s.turns[i : i + 2])))
        return out

    def scored_questions(self) -> list[Question]:
        return [q for q in self.questions if q.category in SCORED_CATEGORIES]


def parse_session_date(value: str) -> datetime:
    """Parse LoCoMo's ``"1:56 pm on 8 May, 2023"`` into an aware UTC datetime."""
    text = " ".join(str(value).split())
    for fmt in _DATE_FORMATS:
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
    raise ImportFormatError(f"unrecognised session date {value!r}")


def split_evidence(entries: Iterable[Any]) -> list[str]:
    """Turn ids of an evidence list; entries holding several ids (``"D8:6; D9:17"``) are split."""
    out: list[str] = []
    for entry in entries:
        for dia_id in _DIA_ID.findall(str(entry)):
            if dia_id not in out:
                out.append(dia_id)
    return out


def parse_conversation(data: dict[str, Any], conv_id: str) -> Conversation:
    """Build a Conversation from one LoCoMo JSON object (one entry of locomo10.json)."""
    if "conversation" in data and isinstance(data["conversation"], dict):
        # The upstream locomo10.json nests the dialogue; the per-file split does not.
        merged = dict(data["conversation"])
        merged["qa"] = data.get("qa", [])
        data = merged
    try:
        speakers = (str(data["speaker_a"]), str(data["speaker_b"]))
    except KeyError as exc:
        raise ImportFormatError(f"conversation {conv_id}: missing {exc.args[0]}") from exc
    sessions: list[Session] = []
    for key, value in data.items():
        m = _SESSION_KEY.fullmatch(key)
        if not m or not value:
            continue
        number = int(m.group(1))
        date_key = f"{key}_date_time"
        if date_key not in data:
            raise ImportFormatError(f"conversation {conv_id}: {key} has no {date_key}")
        turns = []
        for i, raw in enumerate(value):
            try:
                turns.append(
                    Turn(
                        dia_id=str(raw["dia_id"]),
                        speaker=str(raw["speaker"]),
                        text=str(raw["text"]),
                        caption=str(raw["blip_caption"]) if raw.get("blip_caption") else None,
                    )
                )
            except (KeyError, TypeError) as exc:
                raise ImportFormatError(f"conversation {conv_id}: bad turn in {key}", i + 1) from exc
        sessions.append(Session(number, parse_session_date(data[date_key]), tuple(turns)))
    sessions.sort(key=lambda s: s.number)
    index = {t.dia_id: t for s in sessions for t in s.turns}

    questions: list[Question] = []
    skipped = 0
    for raw in data.get("qa", []):
        category = int(raw.get("category", 0))
        evidence = [e for e in split_evidence(raw.get("evidence", [])) if e in index]
        if category in SCORED_CATEGORIES and not evidence:
            # Nothing to score against (no evidence, or ids that name no turn).
            skipped += 1
            continue
        answer = raw.get("answer", raw.get("adversarial_answer", ""))
        questions.append(Question(str(raw["question"]), str(answer), category, tuple(evidence)))
    return Conversation(conv_id, speakers, tuple(sessions), tuple(questions), skipped, index)


def load_conversations(paths: Sequence[str | Path]) -> list[Conversation]:
    """Load LoCoMo files: one conversation per file, or a list of them (``locomo10.json``)."""
    out: list[Conversation] = []
    for p in paths:
        path = Path(p)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ImportFormatError(f"{path}: {exc}") from exc
        if isinstance(data, list):
            for i, item in enumerate(data):
                conv_id = str(item.get("sample_id", f"{path.stem}-{i}"))
                out.append(parse_conversation(item, conv_id))
        elif isinstance(data, dict):
            out.append(parse_conversation(data, path.stem))
        else:
            raise ImportFormatError(f"{path}: expected a JSON object or list")
    return out
