"""Consolidation's misplaced-topics step (docs/tree.md, "Misplaced topics"): a closed topic
under a top-level theme moves to the branch it relates to better, or to the top level when it
relates to nothing; each move is logged and undoable, and a second run moves nothing. Real
MiniLM, a real SQLite file, a subject history of ours (benchmarks/data/subjects_check5.json:
Fergus, whose gout branch took a heel blister from his long walk and a brain scan of his mum
while placement homed them)."""

from __future__ import annotations

from collections import Counter

import pytest

from arbormem import Memory
from arbormem.config import Settings, TreeSettings
from arbormem.eval import segmetrics as sm

from .conftest import add_history, check_tree, history
from .test_short_returns import _branches

ANOTHER = "relates to another branch better than to its own"


# The tree placement really builds (this package's conftest turns same-thread returns off).
pytestmark = pytest.mark.usefixtures("real_placement")


def _fergus() -> list[dict]:
    return history("subjects_check5.json", "Fergus")


def _add(mem: Memory, rows: list[dict]) -> dict[str, str]:
    added = add_history(mem, rows)
    return {e.id: x["subject"] for e, x in zip(added, rows, strict=True)}


def _v(mem: Memory, subject: dict[str, str]) -> float:
    branch = _branches(mem)
    ids = sorted(subject)
    return sm.v_measure([subject[i] for i in ids], [branch[i] for i in ids])[2]


def test_misplaced_topics_move_to_their_subject_and_a_move_undoes(tmp_path, minilm) -> None:  # type: ignore[no-untyped-def]
    rows = _fergus()
    with Memory(tmp_path / "off.db", embedder=minilm,
                settings=Settings(tree=TreeSettings(rehome_topics=False))) as off:
        subject_off = _add(off, rows)
        off.consolidate("u")
        v_off = _v(off, subject_off)
    with Memory(tmp_path / "m.db", embedder=minilm) as mem:
        subject = _add(mem, rows)
        exchanges = set(subject)
        mem.consolidate("u")
        changes = [c for c in mem.store.list_changes("u", limit=500) if c.action == "rehome"]
        moves = [c for c in changes if c.detail["reason"] == ANOTHER]
        assert len(moves) >= 3
        after = _branches(mem)
        topic_of = {e.id: e.topic_id for e in mem.exchanges(user_id="u")}
        joined_kin = 0
        for c in moves:
            assert c.detail["link"] >= c.detail["threshold"]
            ids = [e for e in subject if topic_of[e] == c.target_id]
            mine = Counter(subject[e] for e in ids).most_common(1)[0][0]
            kin = Counter(subject[e] for e in subject if after[e] == after[ids[0]] and e not in ids)
            joined_kin += kin.most_common(1)[0][0] == mine
        # Most moves join the branch of the topic's own subject (the gout branch's heel
        # blister goes to the walk).
        assert 3 * joined_kin >= 2 * len(moves)
        assert _v(mem, subject) > v_off
        assert set(_branches(mem)) == exchanges  # every exchange kept, each in one branch
        check_tree(mem, "u")

        # A second run finds nothing more to move.
        again = mem.consolidate("u")
        assert not [c for c in mem.store.list_changes("u", limit=500)
                    if c.action == "rehome" and c.id not in {x.id for x in changes}]
        assert again.rehomed == 0

        # Undo: the topic goes back under the theme it left (while that theme is there) and
        # the next run leaves it there.
        moved = next(c for c in moves if mem.store.get_topic(c.detail["from"]) is not None)
        mem.undo(moved.id, user_id="u")
        assert mem.topic(moved.target_id, user_id="u").parent_id == moved.detail["from"]
        mem.consolidate("u")
        assert mem.topic(moved.target_id, user_id="u").parent_id == moved.detail["from"]
        assert set(_branches(mem)) == exchanges
        check_tree(mem, "u")
        assert mem.history(moved.target_id, user_id="u")


def test_the_step_can_be_turned_off(tmp_path, minilm) -> None:  # type: ignore[no-untyped-def]
    settings = Settings(tree=TreeSettings(rehome_topics=False))
    with Memory(tmp_path / "m.db", embedder=minilm, settings=settings) as mem:
        _add(mem, _fergus())
        mem.consolidate("u")
        assert not [c for c in mem.store.list_changes("u", limit=500)
                    if c.action == "rehome" and c.detail["reason"].startswith("relates to")]
