"""A merged topic stays findable by each of its parts (alias centroids in the topic index),
and recall follows consolidation's cross-links within its budget.

MiniLM where the point is a real embedding's geometry (a merged centroid is the mean of two
sub-subjects); HashEmbedder where only word overlap matters."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from arbormem import Memory
from arbormem.check import check
from arbormem.embed.testing import HashEmbedder
from arbormem.organize.aliases import alias_id, is_alias, resolve_topic_hits
from arbormem.organize.consolidate import ConsolidationOptions
from arbormem.organize.recall_hooks import LINK_WEIGHT
from arbormem.organize.thresholds import Thresholds
from arbormem.store.base import Store
from arbormem.text import terms
from tests.conftest import chat

from .conftest import check_tree, fragmented

# Two sub-subjects of one subject: becoming a school counsellor, and sleeping badly from
# anxiety. The same closing line in every answer gives them the shared specific terms the
# offline veto asks for; everything else differs.
SHARED = " talk to the school counselor about anxiety."
CAREER = [
    ("i want to become a school counselor and help teenagers with anxiety.", "a school counselor needs a degree and supervised practice hours."),
    ("the counseling course covers anxiety disorders and career guidance at school.", "career guidance is a big part of the school counselor job."),
    ("i applied to a master's program to work as a school counselor on anxiety.", "good luck with the application, the program sounds great."),
]
SLEEP = [
    ("my anxiety keeps me awake at night, i can't sleep before school exams, my counselor says.", "try a fixed bedtime and no screens an hour before sleep."),
    ("the school counselor suggested breathing exercises for anxiety at bedtime.", "slow breathing lowers the heart rate and helps you fall asleep."),
    ("chamomile tea and a warm shower help my sleep when anxiety is bad, as the counselor said.", "a calm evening routine is good for sleep."),
]
SLEEP_QUERY = "What helps her fall asleep when anxiety keeps her awake at night?"
# Thresholds low enough that the pair is a candidate; the offline veto still decides.
FORCE_MERGE = ConsolidationOptions(thresholds=Thresholds(merge=0.3, link=0.2, duplicate=0.95, supersede=0.55, tag=0.8),
                                   link=False, archive=False, dedup=False, supersede=False)


def _counselling(mem: Memory) -> tuple[str, str]:
    # Filler first so that "anxiety" and "counselor" are specific terms (in few exchanges).
    items = [{"messages": chat(f"f{i}a f{i}b f{i}c", f"f{i}d f{i}e"), "session_id": f"x{i}"} for i in range(60)]
    items += [{"messages": chat(u, a + SHARED), "session_id": "career"} for u, a in CAREER]
    items += [{"messages": chat("what's a good recipe for banana bread?", "use ripe bananas."), "session_id": "y"}]
    items += [{"messages": chat(u, a + SHARED), "session_id": "sleep"} for u, a in SLEEP]
    items += [{"messages": chat("my car makes a grinding noise when braking.", "check the brake pads."), "session_id": "z"}]
    mem.add_many(items, user_id="u")
    exs = mem.exchanges(user_id="u")
    career, sleep = exs[60].topic_id, exs[64].topic_id
    assert career and sleep and career != sleep
    assert {e.topic_id for e in exs[60:63]} == {career} and {e.topic_id for e in exs[64:67]} == {sleep}
    return career, sleep


def _topic_hits(mem: Memory, qvec: np.ndarray) -> list[tuple[str, float]]:
    return [(t, s) for t, s, _ in resolve_topic_hits(mem.store.vector_search("u", "topic", qvec, 64))]


def test_resolved_ranks_count_parts_as_topics() -> None:
    raw = [("t_b", 0.9), ("t_a~t_x", 0.8), ("t_c", 0.7), ("t_a~t_a", 0.6), ("t_a", 0.5), ("t_d", 0.4)]
    # t_a ranks as its best part; its other part keeps a slot (as when it was a topic), so t_c
    # and t_d keep the ranks they had before the merge; the mean centroid t_a is not a slot.
    assert resolve_topic_hits(raw) == [("t_b", 0.9, 0), ("t_a", 0.8, 1), ("t_c", 0.7, 2), ("t_d", 0.4, 4)]
    # A merged topic none of whose parts was found ranks by its mean centroid.
    assert resolve_topic_hits([("t_a", 0.5), ("t_d", 0.4)]) == [("t_a", 0.5, 0), ("t_d", 0.4, 1)]


def test_merged_topic_scores_as_its_best_part(tmp_path: Path, minilm) -> None:
    mem = Memory(tmp_path / "m.db", embedder=minilm)
    career, sleep = _counselling(mem)
    qvec = minilm.embed_one(SLEEP_QUERY)
    before = _topic_hits(mem, qvec)
    rank_before = [t for t, _ in before].index(sleep)
    score_before = dict(before)[sleep]
    chamomile = mem.exchanges(user_id="u")[66].id
    assert chamomile in {e.id for e in mem.recall(SLEEP_QUERY, user_id="u", max_tokens=300).exchanges}
    sleep_labels = mem.store.get_topic(sleep)
    assert sleep_labels is not None

    report = mem.consolidate("u", options=FORCE_MERGE)
    merge = next(c for c in mem.store.list_changes("u") if c.action == "merge")
    assert report.merged == 1 and (merge.detail["survivor"], merge.target_id) == (career, sleep)
    survivor = mem.store.get_topic(career)
    assert survivor is not None and sorted(survivor.meta.aliases) == sorted([career, sleep])
    check_tree(mem, "u")

    # The merged centroid alone scores lower for the sleep question than the sleep topic did:
    # what the alias is for.
    merged_cos = float(survivor.centroid() @ qvec)
    assert merged_cos < score_before - 0.02
    # With the alias the survivor scores (and ranks) exactly as the absorbed part did.
    after = _topic_hits(mem, qvec)
    assert [t for t, _ in after].index(career) <= rank_before
    assert dict(after)[career] >= score_before - 1e-5
    assert sleep not in dict(after), "the absorbed id is never returned, only its survivor"
    # The lexical side: the survivor's text entry carries each part's pre-merge labels, so
    # every word the sleep topic was found by still finds the merged topic.
    assert sorted(survivor.meta.part_text) == sorted([career, sleep])
    for word in {*terms(sleep_labels.title), *sleep_labels.keywords, *terms(sleep_labels.summary)}:
        assert career in [i for i, _ in mem.store.text_search("u", "topic", [word], 1000)], word
    # Recall still finds the absorbed part's answer at the same small budget, and the topic
    # lift the retriever gives the merged topic is not lower than the sleep topic's was.
    r = mem.recall(SLEEP_QUERY, user_id="u", max_tokens=300)
    assert chamomile in {e.id for e in r.exchanges} and r.tokens <= 300
    mem.close()


def test_undo_removes_the_alias(tmp_path: Path, minilm) -> None:
    mem = Memory(tmp_path / "m.db", embedder=minilm)
    career, sleep = _counselling(mem)
    mem.consolidate("u", options=FORCE_MERGE)
    merge = next(c for c in mem.store.list_changes("u") if c.action == "merge")
    assert set(mem.store.get_vectors("u", "topic", [alias_id(career, career), alias_id(career, sleep)])) == {
        alias_id(career, career), alias_id(career, sleep)}
    mem.undo(merge.id, user_id="u")
    assert not mem.store.get_vectors("u", "topic", [alias_id(career, career), alias_id(career, sleep)])
    for tid in (career, sleep):
        rec = mem.store.get_topic(tid)
        assert rec is not None and not rec.meta.aliases and not rec.meta.part_text
    check_tree(mem, "u")
    assert check(mem).ok
    # The restored topic answers for itself again.
    hits = _topic_hits(mem, minilm.embed_one(SLEEP_QUERY))
    assert hits[0][0] in (sleep, mem.store.get_topic(sleep).parent_id)  # type: ignore[union-attr]
    mem.close()


def test_aliases_follow_chains_of_merges_undo_and_deletion(db_path: Path) -> None:
    mem = Memory(db_path, embedder=HashEmbedder())
    mem.add_many(fragmented(240), user_id="u")
    opts = ConsolidationOptions(archive=False, dedup=False, supersede=False)
    runs = [mem.consolidate("u", options=opts) for _ in range(3)]
    assert all(r.merged for r in runs)
    check_tree(mem, "u")
    report = check(mem)
    assert report.ok, [str(p) for u in report.users for p in u.problems]
    merges = [c for c in mem.store.list_changes("u", limit=10_000) if c.action == "merge"]
    # Some survivor of a later run had been a survivor before: its parts moved with it.
    absorbed_survivors = {c.detail["absorbed"]["id"] for c in merges} & {c.detail["survivor"] for c in merges}
    assert absorbed_survivors
    leaves = [r for r in mem.store.list_topics("u") if r.kind == "topic"]
    merged = [r for r in leaves if r.meta.aliases]
    assert any(len(r.meta.aliases) > 2 for r in merged), "a chain a <- b <- c keeps all three parts"

    # Deleting an exchange of a merged topic drops its aliases (a part's centroid would still
    # carry the deleted text's vector); the topic then scores by its own centroid.
    # (A middle exchange: deleting a topic's first or last one leaves a stale span, a separate
    # bug of Memory.delete that check_tree would report.)
    victim = next(r for r in merged if r.size >= 3)
    ex = mem.store.list_exchanges("u", topic_id=victim.id)[1]
    mem.delete(ex.id)
    after = mem.store.get_topic(victim.id)
    assert after is not None and not after.meta.aliases and not after.meta.part_text
    assert not [i for i, _ in mem.store.vector_search("u", "topic", after.centroid(), 10_000)
                if is_alias(i) and i.startswith(victim.id)]
    check_tree(mem, "u")
    assert check(mem).ok

    # Undo everything, newest first (undo of a merge whose survivor was absorbed later waits
    # for that later undo): no alias is left anywhere.
    for c in merges:
        mem.undo(c.id, user_id="u")
    check_tree(mem, "u")
    assert check(mem).ok
    nodes = [r for r in mem.store.list_topics("u") if r.kind != "root"]
    assert not [i for i, _ in mem.store.vector_search("u", "topic", nodes[0].centroid(), 10_000) if is_alias(i)]
    mem.close()


def test_check_reports_a_dangling_alias(db_path: Path) -> None:
    mem = Memory(db_path, embedder=HashEmbedder())
    mem.add_many(fragmented(120), user_id="u")
    mem.consolidate("u")
    assert check(mem).ok
    leaf = next(r for r in mem.store.list_topics("u") if r.kind == "topic")
    with mem.store.transaction("u"):
        mem.store.put_vectors("u", "topic", [alias_id(leaf.id, "t_gone"), alias_id("t_gone", leaf.id)],
                              np.stack([leaf.centroid(), leaf.centroid()]))  # type: ignore[list-item]
    problems = {p.item_id: p.message for u in check(mem).users for p in u.problems}
    assert problems == {alias_id(leaf.id, "t_gone"): "alias vector of a part its topic does not list",
                        alias_id("t_gone", leaf.id): "alias vector of a missing topic"}
    mem.close()


def test_recall_follows_a_link_within_the_budget(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Placement would put Alice's session under the recital theme itself; this test is about
    # what a link adds between topics that placement left apart.
    monkeypatch.setenv("ARBORMEM_TREE__THEME_THRESHOLD", "2.0")
    mem = Memory(db_path, embedder=HashEmbedder())
    # Fourteen visits to a piano recital, each its own topic, fill the retriever's topic list;
    # Alice's piano session is like them (so it gets linked) but never names the recital.
    items = [{"messages": chat("bruno cooked pasta in the kitchen at home, it tasted good", "cooking at home is fun"),
              "session_id": "d"}]
    items += [{"messages": chat(f"the recital rehearsal at the piano on stage went well, round {i}",
                                f"great, playing the piano on stage is fun {i}"), "session_id": f"r{i}"} for i in range(14)]
    items += [{"messages": chat("alice played the piano on stage and it went well", "playing the piano on stage is fun"),
               "session_id": "b"},
              {"messages": chat("alice played chopin on the piano on stage, it went well", "chopin on stage is fun"),
               "session_id": "b"}]
    items += [{"messages": chat(f"z{i}a z{i}b z{i}c", f"z{i}d"), "session_id": f"z{i}"} for i in range(3)]
    mem.add_many(items, user_id="u")
    exs = mem.exchanges(user_id="u")
    alice, bruno = exs[16], exs[0]
    q = "how did the recital rehearsal go?"

    def scores() -> dict[str, float]:
        return {h.exchange.id: h.score for h in mem.search(q, user_id="u", limit=50)}

    before = scores()
    # Links only (no merge): every pair at least 0.6 similar, up to 20 links a topic.
    opts = ConsolidationOptions(thresholds=Thresholds(merge=0.99, link=0.6, duplicate=0.99, supersede=0.99, tag=0.99),
                                max_links=20, archive=False, dedup=False, supersede=False)
    mem.consolidate("u", options=opts)
    linked = mem.store.get_topic(alice.topic_id)  # type: ignore[arg-type]
    assert linked is not None and linked.meta.links
    assert not mem.store.get_topic(bruno.topic_id).meta.links  # type: ignore[arg-type,union-attr]
    # The light read of the links recall follows equals the links of the whole records.
    ids = [r.id for r in mem.store.list_topics("u")] + ["t_unknown"]
    assert mem.store.topic_links("u", ids) == Store.topic_links(mem.store, "u", ids)
    assert mem.store.topic_links("u", [alice.topic_id]) == {alice.topic_id: tuple(linked.meta.links)}  # type: ignore[index]
    assert mem.store.topic_links("someone else", ids) == {}
    after = scores()
    # Alice's turn rises by the link's share of topic relevance; an unlinked turn does not move.
    assert after[alice.id] > before[alice.id] + 0.5 * LINK_WEIGHT * 0.5
    assert after[bruno.id] == before[bruno.id]
    # Recall packs it as soon as the budget has room after the recital turns, within budget.
    for budget in range(200, 2000, 20):
        r = mem.recall(q, user_id="u", max_tokens=budget)
        if alice.id in {e.id for e in r.exchanges}:
            break
    assert alice.id in {e.id for e in r.exchanges} and r.tokens <= budget
    assert bruno.id not in {e.id for e in r.exchanges}
    # Undoing the links takes the lift away again.
    for c in mem.store.list_changes("u", limit=1000):
        if c.action == "link" and alice.topic_id in (c.detail["a"], c.detail["b"]):
            mem.undo(c.id, user_id="u")
    assert scores()[alice.id] == before[alice.id]
    mem.close()
