"""Consolidation's short-returns pass (docs/tree.md, "Short returns"): a one-to-three exchange
topic that placement left alone at the top level joins the branch of its subject; the move is
logged, undoable, and an undone move is not made again. Real MiniLM, a real SQLite file and a
real PostgreSQL, one of our subject histories (benchmarks/data/subjects_dev.json)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from arbormem import Memory
from arbormem.errors import NotFoundError
from arbormem.eval import segmetrics as sm

from .conftest import add_history, check_tree, default_settings, history


def _history(name: str) -> list[dict]:
    return history("subjects_dev.json", name)


def _branches(mem: Memory) -> dict[str, str]:
    """Exchange id -> id of its top-level branch."""
    top_of = {n.id: b.id for b in mem.tree(user_id="u").children for n in b.walk()}
    return {e.id: top_of[e.topic_id] for e in mem.exchanges(user_id="u") if e.topic_id}


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_short_returns_join_their_subject_and_an_undone_move_stays_undone(  # type: ignore[no-untyped-def]
        tmp_path, minilm, backend, request) -> None:
    rows = _history("Graham")
    if backend == "postgres":
        from arbormem.store.postgres import PostgresStore

        opened = Memory(store=PostgresStore(request.getfixturevalue("pg_database"), max_size=4), embedder=minilm)
    else:
        opened = Memory(tmp_path / "m.db", embedder=minilm)
    with opened as mem:
        added = add_history(mem, rows)
        subject = {e.id: x["subject"] for e, x in zip(added, rows, strict=True)}
        before = _branches(mem)
        members: dict[str, list[str]] = {}
        for i, b in before.items():
            members.setdefault(b, []).append(subject[i])
        # Placement leaves some returns alone at the top level beside their subject's branch.
        strays = {b for b, subs in members.items() if len(subs) <= 3 and not subs[0].startswith("misc")
                  and any(o != b and len(s) > 3 and Counter(s).most_common(1)[0][0] == subs[0]
                          for o, s in members.items())}
        assert strays

        report = mem.consolidate("u")
        after = _branches(mem)
        moves = [c for c in mem.store.list_changes("u", limit=500) if c.action == "rehome"]
        assert report.rehomed == len(moves) > 0
        # At least half of the strays now share a branch with the rest of their subject (on this
        # history, with the shift head: a Spanish lesson left beside the Spanish branch).
        home = 0
        for b in strays:
            ids = [i for i, x in before.items() if x == b]
            kin = [i for i, x in before.items() if subject[i] == subject[ids[0]] and x != b]
            home += after[ids[0]] in {after[i] for i in kin}
        assert home >= 1 and 2 * home >= len(strays)
        labels = [subject[e.id] for e in added]
        v_before = sm.v_measure(labels, [before[e.id] for e in added])[2]
        v_after = sm.v_measure(labels, [after[e.id] for e in added])[2]
        assert v_after > v_before
        assert sorted(after) == sorted(before)  # every exchange kept, each in one branch
        check_tree(mem, "u")  # aggregates, spans and indexes exact after the moves

        # Undo one move: the topic is back at the top level, and the next run leaves it there.
        moved = moves[0]
        mem.undo(moved.id, user_id="u")
        assert mem.topic(moved.target_id, user_id="u").parent_id == mem.tree(user_id="u").id
        again = mem.consolidate("u")
        assert mem.topic(moved.target_id, user_id="u").parent_id == mem.tree(user_id="u").id
        assert again.rehomed == 0
        check_tree(mem, "u")
        assert mem.history(moved.target_id, user_id="u")


LOCOMO = Path(__file__).resolve().parents[3] / "shared" / "data" / "locomo" / "30.json"


@pytest.mark.skipif(not LOCOMO.exists(), reason="../shared/data/locomo not beside the checkout")
def test_namesakes_at_the_top_level_become_one_branch(tmp_path, minilm) -> None:  # type: ignore[no-untyped-def]
    # A chat between two friends: every exchange is alike (background ~0.46 with MiniLM), so
    # two sessions on one subject are placed as two top-level topics with the same title.
    from arbormem.eval.locomo import load_conversations
    from arbormem.eval.runner import ingest_conversation
    from arbormem.organize.labels import title_key

    conv = load_conversations([LOCOMO])[0]
    with Memory(tmp_path / "m.db", embedder=minilm) as mem:
        ingest_conversation(mem, conv, "u")

        def namesakes() -> list[list[str]]:
            by: dict[str, list[str]] = {}
            for b in mem.tree(user_id="u").children:
                by.setdefault(title_key(b.title), []).append(b.id)
            return [ids for ids in by.values() if len(ids) > 1]

        twins = namesakes()
        assert twins, [b.title for b in mem.tree(user_id="u").children]
        exchanges = {e.id for e in mem.exchanges(user_id="u")}
        mem.consolidate("u")
        moves = [c for c in mem.store.list_changes("u", limit=500)
                 if c.action == "rehome" and c.detail["reason"].startswith("titled as")]
        assert moves
        checked = 0
        for c in moves:
            assert c.detail["link"] >= c.detail["threshold"]  # no less related than any two exchanges
            # Under the branch it joined (a later move may have split that branch's children
            # into sub-themes: fan-out stays bounded). A theme that joined and then lost all but
            # one child to the misplaced-topics step is dissolved (a theme with one child is that
            # child): its move has no node left to follow.
            try:
                node = mem.topic(c.target_id, user_id="u")
            except NotFoundError:
                continue
            checked += 1
            chain = []
            while node.parent_id is not None:
                chain.append(node.parent_id)
                node = mem.topic(node.parent_id, user_id="u")
            assert c.detail["to"] in chain
        assert checked or len(moves) == 1
        assert len(namesakes()) < len(twins)
        assert {e.id for e in mem.exchanges(user_id="u")} == exchanges
        check_tree(mem, "u")


def test_namesakes_left_apart_are_told_apart_and_judged_again(tmp_path, minilm) -> None:  # type: ignore[no-untyped-def]
    # Two unrelated top-level branches wearing one title (as placement titles them when both
    # name the kitchen: a renovation and a wine stain on a carpet): the namesakes step judges
    # them too far apart to join, and a reader must still not see the title twice.
    import dataclasses

    import numpy as np

    from arbormem.organize.labels import title_key

    rows = _history("Tom")
    with Memory(tmp_path / "m.db", embedder=minilm) as mem:
        add_history(mem, rows)
        tops = [b for b in mem.tree(user_id="u").children if b.size >= 2]
        big = max(tops, key=lambda b: b.size)
        vecs = mem.store.get_vectors("u", "topic", [b.id for b in tops])
        # the branch least like the biggest one, titled as it
        far = min((b for b in tops if b.id != big.id), key=lambda b: float(np.dot(vecs[b.id], vecs[big.id])))
        stored = mem.store.get_topic(far.id)
        mem.store.put_topic(dataclasses.replace(stored, title=big.title))
        exchanges = {e.id for e in mem.exchanges(user_id="u")}

        mem.consolidate("u")
        assert not [c for c in mem.store.list_changes("u", limit=500)
                    if c.action == "rehome" and c.target_id == far.id]  # not related enough to join
        by: dict[str, list[str]] = {}
        for b in mem.tree(user_id="u").children:
            by.setdefault(title_key(b.title), []).append(b.id)
        assert all(len(ids) == 1 for ids in by.values()), by
        moved = mem.store.get_topic(far.id)
        assert moved.parent_id == mem.tree(user_id="u").id and moved.title != big.title
        assert moved.meta.not_titled == [title_key(big.title)]  # kept, so later runs judge the pair again
        # The next run changes no title.
        titles = {b.id: b.title for b in mem.tree(user_id="u").children}
        mem.consolidate("u")
        assert {b.id: b.title for b in mem.tree(user_id="u").children} == titles
        assert {e.id for e in mem.exchanges(user_id="u")} == exchanges
        check_tree(mem, "u")


@pytest.mark.usefixtures("real_placement")
def test_a_namesake_joined_under_its_twin_takes_another_title(  # type: ignore[no-untyped-def]
        tmp_path, minilm) -> None:
    # Zofia (benchmarks/data/subjects_check9.json): placement leaves two top-level branches
    # titled "Hearing aids" (her dad's first visits; his later adjustments); the namesakes step
    # joins the smaller under the bigger, whose title does not change. The joined branch must
    # not read "Hearing aids > Hearing aids". (Titled by counts alone: since the themes' own
    # words compete for titles by closeness, docs/titles.md, the bigger branch, which also
    # holds her tax questions, reads "Costs" and the pair is not a namesake any more.)
    from arbormem.organize.labels import title_key

    rows = history("subjects_check9.json", "Zofia")
    with Memory(tmp_path / "m.db", embedder=minilm, settings=default_settings(title_vectors=False)) as mem:
        add_history(mem, rows)
        mem.consolidate("u")
        joined = [c for c in mem.store.list_changes("u", limit=500)
                  if c.action == "rehome" and c.detail["reason"].startswith("titled as")]
        assert joined
        repeats = [(n.title, c.title) for n in mem.tree(user_id="u").walk() if n.kind == "theme"
                   for c in n.children if title_key(c.title) == title_key(n.title)]
        assert not repeats
        check_tree(mem, "u")


@pytest.mark.usefixtures("real_placement")
def test_a_one_off_question_linking_weakly_to_several_branches_stays_alone(  # type: ignore[no-untyped-def]
        tmp_path, minilm) -> None:
    # Ines (benchmarks/data/subjects_check4.json) asks once how much salt goes in pasta water;
    # it links a little to her sea kayaking and about as much to another branch. Without the
    # gap the step filed it under sea kayaking; with it the question stays alone. And since
    # single exchanges no longer move at all (``small_topic_min``, docs/tree.md "One exchange
    # alone stays alone") it stays alone without the gap too.
    from arbormem.config import Settings, TreeSettings

    rows = history("subjects_check4.json", "Ines")
    alone = {}
    gap0 = TreeSettings().small_topic_gap
    for gap, least in ((0.0, 1), (gap0, 1), (0.0, 2)):
        with Memory(tmp_path / f"m{gap}-{least}.db", embedder=minilm,
                    settings=Settings(tree=TreeSettings(small_topic_gap=gap, small_topic_min=least))) as mem:
            added = add_history(mem, rows)
            subject = {e.id: x["subject"] for e, x in zip(added, rows, strict=True)}
            pasta = next(i for i, s in subject.items() if s == "misc:pasta-water")
            assert len([i for i, b in _branches(mem).items() if b == _branches(mem)[pasta]]) == 1
            mem.consolidate("u")
            after = _branches(mem)
            alone[gap, least] = {subject[i] for i, b in after.items() if b == after[pasta]} == {"misc:pasta-water"}
            check_tree(mem, "u")
    assert alone == {(0.0, 1): False, (gap0, 1): True, (0.0, 2): True}


@pytest.mark.usefixtures("real_placement")
def test_a_single_exchange_alone_at_the_top_stays_alone(tmp_path, minilm) -> None:  # type: ignore[no-untyped-def]
    # Anneke (benchmarks/data/subjects_check11.json) asks once for "the word for the smell
    # after rain"; it links best to her leaking gutter, clearly enough for the gap, and the
    # short-returns step filed it there. One exchange alone is as often such a question as a
    # brief return, so it moves no more (docs/tree.md, "One exchange alone stays alone").
    from arbormem.config import Settings, TreeSettings

    rows = history("subjects_check11.json", "Anneke")
    filed = {}
    for least in (1, TreeSettings().small_topic_min):
        with Memory(tmp_path / f"m{least}.db", embedder=minilm,
                    settings=Settings(tree=TreeSettings(small_topic_min=least))) as mem:
            added = add_history(mem, rows)
            subject = {e.id: x["subject"] for e, x in zip(added, rows, strict=True)}
            word = next(i for i, s in subject.items() if s == "misc:word-petrichor")
            mem.consolidate("u")
            after = _branches(mem)
            filed[least] = {subject[i] for i, b in after.items() if b == after[word]} - {"misc:word-petrichor"}
            check_tree(mem, "u")
    assert filed == {1: {"gutter-leak"}, 2: set()}
