"""Returns mid-session (docs/tree.md, "Returns mid-session"): an exchange that goes back to a
subject of an earlier session, inside a session about another, leaves the open topic and goes
home to that subject's topic. Real MiniLM, a real SQLite file, a history written blind by
another hand (``benchmarks/data/subjects_check10.json``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from arbormem import Memory

from .conftest import default_settings, history, partition, placed_leaves

# The tree placement really builds (this package's conftest turns same-thread returns off).
pytestmark = pytest.mark.usefixtures("real_placement")


def _placed(path: Path, minilm, rows: list[dict], **tree: object) -> list[str]:  # type: ignore[no-untyped-def]
    with Memory(path, embedder=minilm, settings=default_settings(**tree)) as mem:
        return placed_leaves(mem, rows)


def test_a_return_to_an_earlier_subject_goes_home(tmp_path, minilm) -> None:  # type: ignore[no-untyped-def]
    rows = history("subjects_check10.json", "Haruka")
    leaves = _placed(tmp_path / "returns.db", minilm, rows)
    # Session 6 is about the visa; "Mochi got her rabies shot today" goes back to the cat's
    # move, talked over in session 2. It links 0.21 to the visa topic, 0.67 to the cat's.
    i = next(k for k, r in enumerate(rows) if r["user"].startswith("Mochi got her rabies shot"))
    assert rows[i - 1]["subject"] == "portugal-d8-visa" and rows[i]["session"] == rows[i - 1]["session"]
    assert leaves[i] != leaves[i - 1]
    cat = [k for k, r in enumerate(rows) if r["subject"] == "cat-relocation" and k < i]
    assert leaves[i] == leaves[cat[0]]
    # With the rule off (return_margin=0) the head keeps it in the visa topic.
    off = _placed(tmp_path / "off.db", minilm, rows, return_margin=0.0)
    assert off[i] == off[i - 1]


def test_a_single_session_is_not_judged_by_it(tmp_path, minilm) -> None:  # type: ignore[no-untyped-def]
    # The rule looks only at topics of other sessions: one session's placement is the same with
    # it or without (task dialogues and chit-chat, one session each, do not change).
    rows = [dict(r, session="one") for r in history("subjects_check10.json", "Haruka")[:20]]
    on = _placed(tmp_path / "on.db", minilm, rows, return_margin=0.15)
    off = _placed(tmp_path / "off.db", minilm, rows, return_margin=0.0)
    assert partition(on) == partition(off)
