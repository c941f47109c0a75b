from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from arbormem.errors import ImportFormatError
from arbormem.eval.locomo import (
    load_conversations,
    parse_session_date,
    split_evidence,
)


def test_loads_turns_sessions_and_questions(mini_path: Path) -> None:
    (conv,) = load_conversations([mini_path])
    assert conv.id == "locomo_mini"
    assert conv.speakers == ("Priya", "Tomas")
    # session_4 is empty and holds no turns; three sessions of 5 + 6 + 3 turns remain
    assert [s.number for s in conv.sessions] == [1, 2, 3]
    assert len(conv.turns) == 14
    assert conv.sessions[1].at == datetime(2024, 3, 17, 18, 40, tzinfo=timezone.utc)


def test_units_pair_consecutive_turns_within_sessions(mini_path: Path) -> None:
    (conv,) = load_conversations([mini_path])
    units = conv.units()
    assert [u.dia_ids for u in units] == [
        ("D1:1", "D1:2"), ("D1:3", "D1:4"), ("D1:5",),
        ("D2:1", "D2:2"), ("D2:3", "D2:4"), ("D2:5", "D2:6"),
        ("D3:1", "D3:2"), ("D3:3",),
    ]
    msgs = units[0].messages()
    assert [m["role"] for m in msgs] == ["user", "assistant"]
    assert [m["name"] for m in msgs] == ["Priya", "Tomas"]
    assert msgs[0]["content"].startswith("Morning Tomas!")
    assert units[0].text().startswith("Priya: Morning Tomas!")
    # the shared photo's caption stays with its turn
    assert "[shares a photo: a photo of a blue ceramic bowl" in units[2].text()
    assert all(u.at == conv.sessions[u.session - 1].at for u in units)


def test_scored_questions_split_evidence_and_skip_unscorable(mini_path: Path) -> None:
    (conv,) = load_conversations([mini_path])
    scored = conv.scored_questions()
    assert [q.category for q in scored] == [4, 2, 1, 4]
    assert scored[2].evidence == ("D1:4", "D3:2")  # "D1:4; D3:2" split into two ids
    assert conv.skipped_questions == 1  # the category-3 question with no evidence
    assert any(q.category == 5 for q in conv.questions)  # kept, but never scored


def test_split_evidence_handles_odd_separators() -> None:
    assert split_evidence(["D8:6; D9:17", "D1:2,D1:3", "D1:2", "junk"]) == [
        "D8:6", "D9:17", "D1:2", "D1:3",
    ]


def test_parse_session_date_and_rejects_garbage() -> None:
    assert parse_session_date("1:56 pm on 8 May, 2023") == datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)
    assert parse_session_date("12:48 am on 1 February, 2023").hour == 0
    with pytest.raises(ImportFormatError):
        parse_session_date("yesterday-ish")


def test_loads_upstream_list_format(tmp_path: Path, mini_path: Path) -> None:
    # locomo10.json: a list of {sample_id, conversation: {...sessions}, qa: [...]}
    raw = json.loads(mini_path.read_text())
    qa = raw.pop("qa")
    path = tmp_path / "locomo10.json"
    path.write_text(json.dumps([{"sample_id": "conv-x", "conversation": raw, "qa": qa}]))
    (conv,) = load_conversations([path])
    assert conv.id == "conv-x"
    assert len(conv.turns) == 14 and len(conv.scored_questions()) == 4


def test_malformed_files_raise_import_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ImportFormatError):
        load_conversations([bad])
    no_date = tmp_path / "nodate.json"
    no_date.write_text(json.dumps({"speaker_a": "A", "speaker_b": "B",
                                   "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "hi"}]}))
    with pytest.raises(ImportFormatError, match="session_1_date_time"):
        load_conversations([no_date])
