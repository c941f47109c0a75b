"""Consolidation: TRACE's four merge axioms, structure and index consistency, undo, links,
tags, archiving, dedup and supersession (HashEmbedder unless similarity calibration matters)."""

from __future__ import annotations

from pathlib import Path

import pytest

from arbormem import Memory
from arbormem.embed.testing import HashEmbedder
from arbormem.errors import ConfigError, StateError
from arbormem.organize.aliases import alias_id, resolve_topic_hits
from arbormem.organize.consolidate import ConsolidationOptions
from arbormem.organize.heuristics import is_trivial, near_duplicate_text
from arbormem.organize.thresholds import Thresholds, thresholds_for
from arbormem.store.state import ExchangeMarks
from tests.conftest import chat

from .conftest import T0, check_tree, fragmented


def _mem(path: Path) -> Memory:
    return Memory(path, embedder=HashEmbedder())


def test_merges_fragmented_subjects_and_keeps_every_invariant(db_path: Path) -> None:
    mem = _mem(db_path)
    mem.add_many(fragmented(240), user_id="u")
    before = check_tree(mem, "u")
    report = mem.consolidate("u")
    after = check_tree(mem, "u")
    assert report.merged > 0 and report.candidates >= report.merged
    assert after["topics"] == before["topics"] - report.merged
    assert len([c for c in mem.store.list_changes("u", limit=1000) if c.action == "merge"]) == report.merged
    # A second run merges what the first left (one merge per topic per run) and stays exact.
    again = mem.consolidate("u")
    check_tree(mem, "u")
    assert again.duration < 30
    mem.close()


def test_older_topic_absorbs_newer_and_ids_stay_stable(db_path: Path) -> None:
    mem = _mem(db_path)
    mem.add_many(fragmented(240), user_id="u")
    ids_before = {t.id: t for t in mem.topics(user_id="u") if t.kind == "topic"}
    report = mem.consolidate("u")
    merges = [c for c in mem.store.list_changes("u", limit=1000) if c.action == "merge"]
    assert merges and len(merges) == report.merged
    for c in merges:
        survivor, absorbed = c.detail["survivor"], c.detail["absorbed"]
        # Chronological guard: the survivor started first.
        assert ids_before[survivor].start_seq < ids_before[absorbed["id"]].start_seq
        # The absorbed topic's exchanges now carry the survivor's id; none was lost.
        for ex_id in c.detail["exchanges"]:
            assert mem.get(ex_id).topic_id == survivor
        assert c.detail["similarity"] >= c.detail["threshold"]
        assert c.detail["veto"]["by"] == "lexical"
        # history() finds the merge from the absorbed id, the survivor and a moved exchange.
        for item in (absorbed["id"], survivor, c.detail["exchanges"][0]):
            assert any(h.id == c.id for h in mem.history(item, user_id="u"))
    surviving = {t.id for t in mem.topics(user_id="u")}
    assert all(c.detail["survivor"] in surviving or any(
        c.detail["survivor"] == m.detail["absorbed"]["id"] for m in merges) for c in merges)
    mem.close()


def test_open_topic_is_never_merged(db_path: Path) -> None:
    mem = _mem(db_path)
    text = "sourdough starter flour oven crust hydration loaf"
    # Unrelated filler first, so the sourdough words are specific to the sourdough topics.
    filler = [{"messages": chat(f"f{i}a f{i}b f{i}c", f"f{i}d f{i}e"), "session_id": f"f{i}"} for i in range(40)]
    mem.add_many(filler + [{"messages": chat(f"{text} {i}", text), "session_id": f"s{i}"} for i in range(3)],
                 user_id="u")
    root = mem.store.list_topics("u", parent_id=None)[0]
    current = root.meta.current
    report = mem.consolidate("u", options=ConsolidationOptions(thresholds=Thresholds(0.1, 0.05, 0.95, 0.3, 0.95)))
    assert mem.store.get_topic(current) is not None
    merges = [c for c in mem.store.list_changes("u") if c.action == "merge"]
    assert report.merged == 1 == len(merges)
    assert current not in (merges[0].detail["survivor"], merges[0].detail["absorbed"]["id"])
    check_tree(mem, "u")
    mem.close()


def test_threshold_is_per_embedder_and_unrelated_topics_stay_apart(db_path: Path) -> None:
    assert thresholds_for("hash-256").merge < thresholds_for("st:all-MiniLM-L6-v2").merge
    assert thresholds_for("st:some-other-model") == thresholds_for("st:all-MiniLM-L6-v2")
    mem = _mem(db_path)
    subjects = ["tomatoes compost seedlings greenhouse", "mortgage pension invoice taxes",
                "piano chopin metronome recital", "marathon intervals knee stretching"]
    mem.add_many([{"messages": chat(s, s), "session_id": f"s{i}"} for i, s in enumerate(subjects * 2)], user_id="u")
    report = mem.consolidate("u")
    for c in mem.store.list_changes("u", limit=100):
        if c.action == "merge":  # only the same subject's two visits may merge
            a = mem.get(c.detail["exchanges"][0]).user_text
            assert a in subjects and mem.store.get_topic(c.detail["survivor"]).size == 2
    assert report.merged <= 4
    check_tree(mem, "u")
    mem.close()


def test_snake_and_language_do_not_merge(tmp_path: Path, minilm) -> None:
    mem = Memory(tmp_path / "m.db", embedder=minilm)
    snake = [
        ("My python keeps hiding under the heat rock in its terrarium.", "Ball pythons like tight hides; check the terrarium temperature."),
        ("How often should I feed my python frozen mice?", "Adult ball pythons eat a thawed mouse every week or two."),
        ("The python shed its skin in one piece today.", "A complete shed means the humidity in the enclosure is right."),
    ]
    lang = [
        ("My Python script crashes with a KeyError in the dictionary loop.", "Use dict.get or check the key before indexing in Python."),
        ("Should I learn Python decorators or generators first?", "Generators first; decorators build on functions as values in Python."),
        ("How do I install a Python package in a virtualenv?", "Activate the venv and run pip install inside it."),
    ]
    items = [{"messages": chat(u, a), "session_id": "snake"} for u, a in snake]
    items += [{"messages": chat("Let's plan my garden beds for spring.", "Sure, what grows well for you?"), "session_id": "x"}]
    items += [{"messages": chat(u, a), "session_id": "lang"} for u, a in lang]
    items += [{"messages": chat("What's a good recipe for banana bread?", "Use ripe bananas."), "session_id": "y"}]
    mem.add_many(items, user_id="u")
    topics = {t.id: t for t in mem.topics(user_id="u") if t.kind == "topic"}
    snake_t = mem.get(mem.exchanges(user_id="u")[0].id).topic_id
    lang_t = mem.get(mem.exchanges(user_id="u")[4].id).topic_id
    assert snake_t != lang_t and snake_t in topics and lang_t in topics
    # Force the pair to be a candidate (threshold far below its similarity): the veto decides.
    low = Thresholds(merge=0.2, link=0.1, duplicate=0.95, supersede=0.55, tag=0.8)
    report = mem.consolidate("u", options=ConsolidationOptions(thresholds=low))
    assert report.vetoed >= 1
    assert mem.get(mem.exchanges(user_id="u")[4].id).topic_id != mem.get(mem.exchanges(user_id="u")[0].id).topic_id
    veto_logged = [c for c in mem.store.list_changes("u") if c.action == "link" and "vetoed" in c.detail["reason"]]
    assert veto_logged, "a vetoed pair is linked instead, with the reason logged"
    check_tree(mem, "u")
    mem.close()


def test_undo_merge_restores_the_absorbed_topic_exactly(db_path: Path) -> None:
    mem = _mem(db_path)
    mem.add_many(fragmented(120), user_id="u")

    def shape() -> dict[str, tuple[int, int | None, int | None, str | None, str]]:
        return {t.id: (t.size, t.start_seq, t.end_seq, t.parent_id, t.title)
                for t in mem.topics(user_id="u") if t.kind == "topic"}

    before = shape()
    report = mem.consolidate("u", options=ConsolidationOptions(archive=False, dedup=False, supersede=False, link=False))
    assert report.merged >= 2
    merges = [c for c in mem.store.list_changes("u", limit=1000) if c.action == "merge"]
    for c in merges:  # newest first: undo in reverse order
        undo = mem.undo(c.id)
        assert undo.action == "undo" and undo.target_id == c.id
        check_tree(mem, "u")
    after = shape()
    assert {i: a[:3] for i, a in after.items()} == {i: b[:3] for i, b in before.items()}
    # Titles are restored where the topic is back under its parent; elsewhere it may be titled
    # anew (a topic does not wear its theme's title, so its title depends on where it sits).
    same_place = [i for i, b in before.items() if after[i][3] == b[3]]
    assert len(same_place) >= 0.8 * len(before)
    assert all(after[i][4] == before[i][4] for i in same_place)
    with pytest.raises(StateError):
        mem.undo(merges[0].id)
    assert all(h.undone for h in mem.history(merges[0].target_id, user_id="u") if h.action == "merge")
    # Restored topics are searchable again by their own content.
    restored = merges[0].detail["absorbed"]["id"]
    hits = mem.search(mem.exchanges(user_id="u")[0].user_text, user_id="u", limit=50)
    assert hits and mem.store.get_topic(restored) is not None
    mem.close()


def test_trivial_exchanges_are_archived_kept_and_reversible(db_path: Path) -> None:
    mem = _mem(db_path)
    mem.add_many([
        {"messages": chat("My sister Leo is allergic to peanuts", "Noted, Leo's peanut allergy.")},
        {"messages": chat("ok", "Glad I could help!")},
        {"messages": chat("thanks!", "You're welcome, anytime.")},
        {"messages": chat("ok so what about the peanut butter cookies", "Skip them for Leo.")},
    ], user_id="u")
    assert is_trivial(mem.exchanges(user_id="u")[1]) and not is_trivial(mem.exchanges(user_id="u")[3])
    report = mem.consolidate("u")
    assert report.archived == 2
    exs = mem.exchanges(user_id="u")
    assert [e.archived for e in exs] == [False, True, True, False]
    assert [e.user_text for e in exs] == ["My sister Leo is allergic to peanuts", "ok", "thanks!",
                                         "ok so what about the peanut butter cookies"]
    hits = mem.search("ok thanks", user_id="u", limit=10)
    assert all(not h.exchange.archived for h in hits)
    change = next(c for c in mem.history(exs[1].id, user_id="u") if c.action == "archive")
    mem.undo(change.id)
    assert not mem.get(exs[1].id).archived
    # A second run does not archive it again: only exchanges newer than its watermark are seen.
    assert mem.consolidate("u").archived == 0
    mem.close()


def test_duplicates_are_linked_not_deleted(db_path: Path) -> None:
    mem = _mem(db_path)
    text = "Book the ryokan in Kyoto for the 12th of April, two nights."
    mem.add_many([
        {"messages": chat(text, "I'll note the Kyoto ryokan dates.")},
        {"messages": chat("Unrelated: the piano recital is on Friday.", "Good luck at the recital!")},
        {"messages": chat(text.upper(), "I'll note the Kyoto ryokan dates!")},
    ], user_id="u")
    assert near_duplicate_text(text, text.upper() + "!") and not near_duplicate_text(text, "Book a hotel in Osaka")
    report = mem.consolidate("u")
    assert report.deduplicated == 1
    exs = mem.exchanges(user_id="u")
    assert len(exs) == 3 and exs[2].user_text == text.upper()
    assert ExchangeMarks.of(exs[2].metadata).duplicate_of == exs[0].id and exs[2].archived and not exs[0].archived
    r = mem.recall("When is the Kyoto ryokan booked?", user_id="u", max_tokens=300, recent=0)
    assert text in r.text and text.upper() not in r.text
    mem.close()


def test_supersession_prefers_and_marks_the_newer_fact(db_path: Path) -> None:
    """TRACE's "memory overwrite": the older fact is shown, marked, never dropped."""
    mem = _mem(db_path)
    filler = fragmented(60)
    items = [{"messages": chat("Remember that Sarah is allergic to nuts, no nuts at her party.",
                               "Noted: Sarah is allergic to nuts."), "at": T0}]
    items += [{**f, "at": T0.replace(year=2024, month=2) + (f["at"] - T0)} for f in filler]
    items += [{"messages": chat("Actually, Sarah can eat nuts now, her nuts allergy is gone.",
                                "Good news, Sarah can have nuts now."), "at": T0.replace(month=6)}]
    mem.add_many(items, user_id="u")
    report = mem.consolidate("u")
    assert report.superseded == 1
    exs = mem.exchanges(user_id="u")
    assert ExchangeMarks.of(exs[0].metadata).superseded_by == exs[-1].id
    assert ExchangeMarks.of(exs[-1].metadata).supersedes == (exs[0].id,)
    r = mem.recall("Can Sarah eat nuts?", user_id="u", max_tokens=400, recent=0)
    assert "(update) user: Actually, Sarah can eat nuts now" in r.text
    assert r.text.index("(superseded)") >= 0
    assert exs[-1].id in r.trace.exchange_scores and exs[0].id in r.trace.exchange_scores
    assert r.trace.exchange_scores[exs[-1].id] > r.trace.exchange_scores[exs[0].id]
    change = next(c for c in mem.history(exs[0].id, user_id="u") if c.action == "supersede")
    mem.undo(change.id)
    assert ExchangeMarks.of(mem.get(exs[0].id).metadata).superseded_by is None
    assert not ExchangeMarks.of(mem.get(exs[-1].id).metadata).supersedes
    mem.close()


def test_links_are_symmetric_bounded_and_survive_merges(db_path: Path) -> None:
    mem = _mem(db_path)
    mem.add_many(fragmented(240, seed=11), user_id="u")
    report = mem.consolidate("u")
    mem.consolidate("u")
    check_tree(mem, "u")  # symmetric, no dangling link after the merges of the second run
    links = [len(r.meta.links) for r in mem.store.list_topics("u")]
    assert report.linked > 0 and max(links) <= ConsolidationOptions().max_links
    t = next(r for r in mem.store.list_topics("u") if r.meta.links)
    assert mem.read(t.id, user_id="u").links == tuple(t.meta.links)
    mem.close()


def test_tags_by_meaning_never_by_substring(minilm) -> None:
    from arbormem.organize.consolidate import normalise_tags

    m = normalise_tags(["ai", "emails", "artificial intelligence", "recipes"], ["email", "recipe", "painting"],
                       minilm.embed, thresholds_for(minilm.name).tag)
    assert m["ai"] != "email"            # substring matching would swallow it
    assert m["emails"] == "email" and m["recipes"] == "recipe"
    assert m["artificial intelligence"] in ("ai", "artificial intelligence")


def test_read_tiers_and_pinned_topics(db_path: Path) -> None:
    mem = _mem(db_path)
    mem.add_many(fragmented(48), user_id="u")
    mem.add_many([{"messages": chat("My blood type is O negative, keep that in mind.", "Noted: O negative."),
                   "session_id": "med"}], user_id="u")
    mem.add_many(fragmented(24, seed=9), user_id="u")
    blood = mem.exchanges(user_id="u")[48]
    tid = blood.topic_id
    assert tid is not None
    r0, r1, r2 = (mem.read(tid, user_id="u", depth=d) for d in (0, 1, 2))
    assert r0.depth == 0 and r0.topic.id == tid and r0.text
    assert r1.source == "extractive" and "O negative" in r1.text
    assert mem.store.get_topic(tid).meta.detail_x == r1.text  # cached
    assert r2.exchanges[0].id == blood.id and "O negative" in r2.text
    q = "what about the piano metronome practice?"
    assert "O negative" not in mem.recall(q, user_id="u", max_tokens=600).text
    mem.pin(tid, user_id="u")
    assert mem.read(tid, user_id="u").recall_mode == "both"
    r = mem.recall(q, user_id="u", max_tokens=600)
    assert "O negative" in r.text and r.tokens <= 600
    mem.set_recall_mode(tid, "active", user_id="u")
    assert "O negative" not in mem.recall(q, user_id="u", max_tokens=600).text
    mem.close()


def test_consolidate_all_users_is_isolated(db_path: Path) -> None:
    mem = _mem(db_path)
    mem.add_many(fragmented(120), user_id="a")
    mem.add_many(fragmented(120, seed=5), user_id="b")
    reports = mem.consolidate()
    assert sorted(r.user_id for r in reports) == ["a", "b"]
    for uid in ("a", "b"):
        check_tree(mem, uid)
        assert all(c.user_id == uid for c in mem.store.list_changes(uid, limit=1000))
    mem.close()


def test_consolidation_and_undo_on_postgresql(pg_database: str) -> None:
    from arbormem.store.postgres import PostgresStore

    mem = Memory(store=PostgresStore(pg_database, max_size=4), embedder=HashEmbedder())
    mem.add_many(fragmented(120), user_id="u")
    before = {t.id: t.size for t in mem.topics(user_id="u") if t.kind == "topic"}
    report = mem.consolidate("u")
    assert report.merged > 0
    check_tree(mem, "u")  # alias entries of merged topics (pgvector rows) match the parts listed
    merged = next(r for r in mem.store.list_topics("u") if r.meta.aliases)
    part = merged.meta.aliases[-1]
    hits = mem.store.vector_search("u", "topic", mem.store.get_vectors("u", "topic", [alias_id(merged.id, part)])[
        alias_id(merged.id, part)], 5)
    assert resolve_topic_hits(hits)[0][0] == merged.id
    for c in [c for c in mem.store.list_changes("u", limit=1000) if c.action == "merge"]:
        mem.undo(c.id, user_id="u")
    check_tree(mem, "u")
    assert not any(r.meta.aliases for r in mem.store.list_topics("u"))
    assert {t.id: t.size for t in mem.topics(user_id="u") if t.kind == "topic"} == before
    mem.close()


def test_consolidation_refuses_another_embedder(db_path: Path) -> None:
    # Tags are embedded and centroids compared during consolidation: a memory opened with a
    # different model must refuse, as reads and writes do, and change nothing.
    with Memory(db_path, embedder=HashEmbedder()) as mem:
        mem.add_many([{"messages": chat(f"note {i} about rowing", "ok")} for i in range(8)], user_id="u")
        before = mem.tree(user_id="u")
    with Memory(db_path, embedder=HashEmbedder(dim=64)) as other, pytest.raises(ConfigError, match="re-embed"):
        other.consolidate("u")
    with Memory(db_path, embedder=HashEmbedder()) as mem:
        assert mem.tree(user_id="u") == before


def test_a_second_run_finds_nothing_to_move(db_path: Path) -> None:
    # Forty unrelated sessions fill the top level past `root_children`: the misplaced-topics
    # step once sent topics that relate to nothing to the full top level, where the top level
    # was grouped again at once, so every run moved them out again (31 moves in each run).
    mem = _mem(db_path)
    filler = [{"messages": chat(f"f{i}a f{i}b f{i}c", f"f{i}d f{i}e"), "session_id": f"f{i}"} for i in range(40)]
    mem.add_many(filler, user_id="u")
    options = ConsolidationOptions(thresholds=Thresholds(0.1, 0.05, 0.95, 0.3, 0.95))
    mem.consolidate("u", options=options)
    moved = [c.target_id for c in mem.store.list_changes("u", limit=1000) if c.action == "rehome"]
    assert len(moved) == len(set(moved))  # no topic moved twice in one run
    again = mem.consolidate("u", options=options)
    assert again.rehomed == 0
    check_tree(mem, "u")
    mem.close()
