"""Consolidation's related-branches step (docs/tree.md, "Related branches"): two top-level
branches of one subject, which placement kept apart by vectors alone, join when their
average link plus the words they share reaches the theme threshold. Real MiniLM, a real
SQLite file, one of our subject histories (benchmarks/data/subjects_dev.json: Tom's home
network, whose last question, weeks after the rest, placement left as a branch of its own)."""

from __future__ import annotations

from collections import Counter

from arbormem import Memory
from arbormem.config import Settings, TreeSettings
from arbormem.eval import segmetrics as sm
from arbormem.organize.heuristics import shared_words

from .conftest import add_history, check_tree, default_settings
from .test_short_returns import _branches, _history


def _subjects_by_branch(mem: Memory, subject: dict[str, str]) -> dict[str, Counter[str]]:
    out: dict[str, Counter[str]] = {}
    for e, b in _branches(mem).items():
        out.setdefault(b, Counter())[subject[e]] += 1
    return out


def test_related_branches_of_one_subject_join_and_the_move_undoes(tmp_path, minilm) -> None:  # type: ignore[no-untyped-def]
    rows = _history("Tom")
    # Placement's return rule ("Returns mid-session") now sends the network's last question
    # away from its session's open topic; this test is about the consolidation step, so it
    # places as before that rule, leaving the network in two branches.
    with Memory(tmp_path / "m.db", embedder=minilm, settings=default_settings(return_margin=0.0)) as mem:
        added = add_history(mem, rows)
        subject = {e.id: x["subject"] for e, x in zip(added, rows, strict=True)}
        before = _branches(mem)
        comp = _subjects_by_branch(mem, subject)
        # Placement left the home network in two top-level branches.
        network = [b for b, c in comp.items() if c.most_common(1)[0][0] == "home-network"]
        assert len(network) >= 2

        mem.consolidate("u")
        moves = [c for c in mem.store.list_changes("u", limit=500)
                 if c.action == "rehome" and c.detail["reason"].startswith("related")]
        assert moves
        after = _branches(mem)
        nodes = {n.id: n for n in mem.tree(user_id="u").walk()}
        topic_of = {e.id: e.topic_id for e in mem.exchanges(user_id="u")}
        for c in moves:
            assert c.detail["link"] >= c.detail["threshold"]
            # Every move joins a branch of the moved branch's own subject.
            inside = {n.id for n in nodes[c.target_id].walk()}
            ids = [e for e in subject if topic_of[e] in inside]
            mine = Counter(subject[e] for e in ids).most_common(1)[0][0]
            kin = Counter(subject[e] for e in subject if after[e] == after[ids[0]] and e not in ids)
            assert kin.most_common(1)[0][0] == mine
        assert len({after[e] for e in subject if subject[e] == "home-network"}) == 1
        labels = [subject[e.id] for e in added]
        assert sm.v_measure(labels, [after[e.id] for e in added])[2] > \
            sm.v_measure(labels, [before[e.id] for e in added])[2]
        assert sorted(after) == sorted(before)  # every exchange kept, each in one branch
        check_tree(mem, "u")

        # Undo: the branch is back at the top level, and the next run leaves it there.
        mem.undo(moves[0].id, user_id="u")
        assert mem.topic(moves[0].target_id, user_id="u").parent_id == mem.tree(user_id="u").id
        mem.consolidate("u")
        assert mem.topic(moves[0].target_id, user_id="u").parent_id == mem.tree(user_id="u").id
        check_tree(mem, "u")


def test_the_step_can_be_turned_off(tmp_path, minilm) -> None:  # type: ignore[no-untyped-def]
    rows = _history("Maya")
    settings = Settings(tree=TreeSettings(related_words=0.0))
    with Memory(tmp_path / "m.db", embedder=minilm, settings=settings) as mem:
        add_history(mem, rows)
        mem.consolidate("u")
        assert not [c for c in mem.store.list_changes("u", limit=500)
                    if c.action == "rehome" and c.detail["reason"].startswith("related")]


def test_shared_words_weighs_recurring_rare_words() -> None:
    df = {"rust": 6, "cargo": 3, "plan": 40, "once": 1}
    n = 100
    a = {"rust": 3, "cargo": 1, "plan": 5, "once": 1}
    b = {"rust": 1, "plan": 7}
    c = {"plan": 9, "once": 1}
    assert shared_words(a, b, df, n) > 0.5
    # A word in more than a quarter of the exchanges, or seen once, is no evidence.
    assert shared_words(a, c, df, n) == 0.0
    assert shared_words(a, {}, df, n) == 0.0
    assert abs(shared_words(a, a, df, n) - 1.0) < 1e-9
