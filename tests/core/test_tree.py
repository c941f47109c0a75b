"""Topic tree shape: bounded fan-out, log depth, spans, stable ids, titles from content."""

from __future__ import annotations

import random

import pytest

from arbormem import Memory, Settings
from arbormem.embed.testing import HashEmbedder
from tests.conftest import chat
from tests.support.subjects import MORE_SUBJECTS

SUBJECTS = MORE_SUBJECTS


def _conversation(n: int, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    names = list(SUBJECTS)
    items, subject = [], names[0]
    for i in range(n):
        if rng.random() < 0.2:
            subject = rng.choice(names)
        words = SUBJECTS[subject].split()
        u = " ".join(rng.choice(words) for _ in range(8))
        a = " ".join(rng.choice(words) for _ in range(8))
        items.append({"messages": chat(f"{u} ({i})", a), "session_id": f"s{i // 25}"})
    return items


def _check_structure(mem: Memory, user: str, max_children: int) -> None:
    root = mem.tree(user_id=user)
    nodes = root.walk()
    assert all(len(n.children) <= max_children for n in nodes)
    leaves = [n for n in nodes if n.kind == "topic"]
    assert all(not n.children for n in leaves)
    assert all(n.kind == "theme" for n in nodes if n.children and n.kind != "root")
    assert sum(t.size for t in leaves) == root.size
    for node in nodes:  # a node's size and span are its leaves'
        if node.kind != "topic" and node.children:
            assert node.size == sum(c.size for c in node.children)
            assert node.start_seq == min(c.start_seq for c in node.children)
    by_topic: dict[str, list[int]] = {}
    for ex in mem.exchanges(user_id=user):
        by_topic.setdefault(ex.topic_id, []).append(ex.seq)
    for leaf in leaves:
        assert leaf.start_seq == min(by_topic[leaf.id]) and leaf.end_seq == max(by_topic[leaf.id])
        assert leaf.title and leaf.keywords


@pytest.mark.slow
def test_depth_is_bounded_on_2000_exchanges() -> None:
    mem = Memory(":memory:", embedder=HashEmbedder())
    mem.add_many(_conversation(2000), user_id="u")
    root = mem.tree(user_id="u")
    assert root.size == 2000
    # log-depth: far below the conversation length; with fan-out 8 well under 12 levels.
    assert root.height() - 1 <= 12
    _check_structure(mem, "u", 8)


def test_structure_invariants_and_small_fanout() -> None:
    s = Settings(tree={"max_children": 3})
    mem = Memory(":memory:", embedder=HashEmbedder(), settings=s)
    mem.add_many(_conversation(300, seed=3), user_id="u")
    _check_structure(mem, "u", 3)
    assert mem.tree(user_id="u").height() - 1 <= 14


def test_topic_ids_are_stable_as_the_tree_grows(mem: Memory) -> None:
    first = mem.add_many(_conversation(40, seed=1), user_id="u")
    ids_before = {e.id: e.topic_id for e in first}
    mem.add_many(_conversation(200, seed=2), user_id="u")
    assert {e.id: e.topic_id for e in mem.exchanges(user_id="u")[:40]} == ids_before
    topic_ids = {t.id for t in mem.topics(user_id="u")}
    assert set(ids_before.values()) <= topic_ids


def test_subject_change_starts_a_new_topic_and_titles_follow_content(mem: Memory) -> None:
    for i in range(4):
        mem.add(chat(f"my sourdough starter and flour hydration question {i}", "sourdough loaf crust oven"), user_id="u", session_id="s")
    for i in range(4):
        mem.add(chat(f"pension mortgage savings budget question {i}", "mortgage pension interest budget"), user_id="u", session_id="s")
    exs = mem.exchanges(user_id="u")
    assert len({e.topic_id for e in exs[:4]}) == 1
    assert exs[4].topic_id != exs[0].topic_id and exs[4].topic_id == exs[7].topic_id
    bread = mem.topic(exs[0].topic_id, user_id="u")
    assert bread.frozen and "sourdough" in bread.keywords
    money = mem.topic(exs[4].topic_id, user_id="u")
    assert not money.frozen and {"mortgage", "pension"} & set(money.keywords)


def test_new_session_starts_a_new_topic(mem: Memory) -> None:
    a = mem.add(chat("piano scales practice", "chopin"), user_id="u", session_id="a")
    b = mem.add(chat("piano scales practice again", "chopin metronome"), user_id="u", session_id="b")
    assert a.topic_id != b.topic_id
    # ...but the same subject lands under the same theme.
    assert mem.topic(a.topic_id, user_id="u").parent_id == mem.topic(b.topic_id, user_id="u").parent_id
