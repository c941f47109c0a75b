"""Follow-ups within a branch (docs/tree.md, "Follow-ups within a branch"): a full message that
links weakly to the open topic stays in it when the topic it links to best, the open one aside,
lies in the open topic's own subject branch; a message whose nearest topic is another subject's
still opens a topic. Real MiniLM, a real SQLite file, subject histories of ours
(benchmarks/data: every file has been read, none is blind any more)."""

from __future__ import annotations

from pathlib import Path

import pytest

from arbormem import Memory

from .conftest import history, placed_leaves

# The tree placement really builds (this package's conftest turns same-thread returns off).
pytestmark = pytest.mark.usefixtures("real_placement")


def _placed(tmp_path: Path, minilm, file: str, name: str) -> tuple[list[dict], list[str]]:  # type: ignore[no-untyped-def]
    rows = history(file, name)
    with Memory(tmp_path / "m.db", embedder=minilm) as mem:
        return rows, placed_leaves(mem, rows)


def _at(rows: list[dict], start: str) -> int:
    return next(i for i, x in enumerate(rows) if x["user"].startswith(start))


@pytest.mark.parametrize(("file", "name", "message"), [
    # An index fund chosen, then "should I put all 150k in at once?": the fund's earlier topic,
    # under the savings theme, is its nearest.
    ("subjects_check7.json", "Henrik", "should I put all 150k in at once"),
    # Concrete test results for a poster, then error bars with three cylinders per mix.
    ("subjects_check8.json", "Beatriz", "how should I show error bars"),
    # A stripped kitchen, then the tiles behind the hob.
    ("subjects_dev.json", "Tom", "Should the tiles go floor-to-ceiling"),
])
def test_a_follow_up_whose_nearest_topic_is_in_its_own_branch_continues_the_topic(  # type: ignore[no-untyped-def]
        tmp_path, minilm, file, name, message) -> None:
    rows, leaves = _placed(tmp_path, minilm, file, name)
    i = _at(rows, message)
    assert rows[i]["subject"] == rows[i - 1]["subject"] and rows[i]["session"] == rows[i - 1]["session"]
    assert leaves[i] == leaves[i - 1]


def test_a_switch_whose_nearest_topic_is_another_subjects_still_opens_a_topic(  # type: ignore[no-untyped-def]
        tmp_path, minilm) -> None:
    # Priya: talk of a neighbour's hedge, then "He wants to book his theory test" (his son's
    # driving lessons, with their earlier topic nearest): a switch the full-message rule catches.
    rows, leaves = _placed(tmp_path, minilm, "subjects_check2.json", "Priya")
    i = _at(rows, "He wants to book his theory test")
    assert rows[i]["subject"] != rows[i - 1]["subject"] and rows[i]["session"] == rows[i - 1]["session"]
    assert leaves[i] != leaves[i - 1]
    # ... and not into a topic of the hedge.
    assert leaves[i] not in {leaves[j] for j in range(i) if rows[j]["subject"] == rows[i - 1]["subject"]}
