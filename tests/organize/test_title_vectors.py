"""Theme titles chosen by closeness (organize/title_vectors.py, docs/titles.md "Nearest
phrase"): among a theme's best-scored candidate phrases, the one the memory's embedder puts
nearest the theme's centroid. Real MiniLM and real SQLite files, one of our subject
histories (benchmarks/data/subjects_dev.json: Graham's solar panels, bees, rental flat...)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from arbormem import Memory
from arbormem.config import TreeSettings
from arbormem.embed.base import Embedder
from arbormem.embed.testing import HashEmbedder
from arbormem.errors import EmbeddingError
from arbormem.organize import labels
from arbormem.organize.title_vectors import PhraseVectors, phrase_vectors

from .conftest import check_tree, default_settings, history
from .test_short_returns import _history


def _items(rows: list[dict]) -> list[dict]:
    return [{"messages": [{"role": "user", "content": x["user"]},
                          {"role": "assistant", "content": x["assistant"]}],
             "session_id": x["session"], "at": x["at"]} for x in rows]


def _themes(mem: Memory) -> dict[frozenset[str], tuple[str, str]]:
    """Each theme by its exchanges: (id, title)."""
    topic_of: dict[str, list[str]] = {}
    for e in mem.exchanges(user_id="u"):
        topic_of.setdefault(e.topic_id or "", []).append(e.text)
    out = {}
    for node in mem.tree(user_id="u").walk():
        if node.kind == "theme":
            texts = frozenset(t for n in node.walk() for t in topic_of.get(n.id, []))
            out[texts] = (node.id, node.title)
    return out


class _Counting(Embedder):
    """The real model behind a call counter (and, with ``fail_short``, an outage for short
    texts only: the titling calls, not the exchanges)."""

    names_phrases = True

    def __init__(self, inner: Embedder, *, fail_short: bool = False) -> None:
        self.inner = inner
        self.name = "counting-minilm"
        self.calls = 0
        self.fail_short = fail_short

    @property
    def dim(self) -> int:
        return self.inner.dim

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        if self.fail_short and all(len(t.split()) <= 4 for t in texts):
            raise EmbeddingError("model server went away")
        return self.inner.embed(list(texts))


def test_each_retitled_theme_is_nearer_its_centroid(tmp_path, minilm) -> None:  # type: ignore[no-untyped-def]
    rows = _history("Graham")
    near = Memory(tmp_path / "near.db", embedder=minilm)
    off = Memory(tmp_path / "off.db", embedder=minilm, settings=default_settings(title_vectors=False))
    with near, off:
        assert near.writer.phrases is not None and off.writer.phrases is None
        for mem in (near, off):
            mem.add_many(_items(rows), user_id="u")
            mem.consolidate("u")
            check_tree(mem, "u")
        a, b = _themes(near), _themes(off)
        same = [k for k in a if k in b]
        assert len(same) >= 4  # the titles do not change the grouping
        differ = [k for k in same if a[k][1] != b[k][1]]
        assert differ, "no theme title moved on a history with 'Battery' for its solar panels"
        vecs = near.store.get_vectors("u", "topic", [a[k][0] for k in differ])
        by_seq = {e.seq: e.user_text for e in near.exchanges(user_id="u")}
        for k in differ:
            c = vecs[a[k][0]] / np.linalg.norm(vecs[a[k][0]])
            chosen, offline = minilm.embed([a[k][1], b[k][1]]) @ c
            # A candidate beats the offline pick only by closeness (its score is at most the
            # best), so a moved title is the nearer one (the offline pick scored best here),
            # or one the theme's opening message names ("The opening message").
            start = near.store.get_topic(a[k][0]).start_seq  # type: ignore[union-attr]
            opening = labels.opening_words(by_seq[start])
            named = all(w in opening for w in labels.opening_words(a[k][1]))
            assert chosen > offline or named, (a[k][1], b[k][1])
        titles = {t for _, t in a.values()}
        assert "Solar panels" in titles  # the subject, where counts alone said "Battery"


def test_a_failing_embedder_keeps_the_offline_titles(tmp_path, minilm) -> None:  # type: ignore[no-untyped-def]
    rows = _history("Graham")[:40]
    shy = _Counting(minilm, fail_short=True)
    plain = _Counting(minilm)
    plain.names_phrases = False  # type: ignore[misc]
    with Memory(tmp_path / "shy.db", embedder=shy) as m1, Memory(tmp_path / "plain.db", embedder=plain) as m2:
        assert m2.writer.phrases is None
        for mem in (m1, m2):
            added = mem.add_many(_items(rows), user_id="u")
            assert len(added) == len(rows)  # nothing lost to the titling outage
            check_tree(mem, "u")
        assert {k: t for k, (_, t) in _themes(m1).items()} == {k: t for k, (_, t) in _themes(m2).items()}


def test_phrase_vectors_are_cached_and_exact(minilm) -> None:  # type: ignore[no-untyped-def]
    counting = _Counting(minilm)
    pv = PhraseVectors(counting, cache=3)
    centroid = minilm.embed(["We are thinking of solar panels and a home battery."])[0]
    first = pv.closeness(["Solar panels", "Battery"], centroid)
    again = pv.closeness(["Battery", "Solar panels"], centroid)
    assert counting.calls == 1  # the second call was served from the cache
    direct = minilm.embed(["Solar panels", "Battery"]) @ centroid
    assert first == pytest.approx(list(direct), abs=1e-6)
    assert again == pytest.approx(list(direct[::-1]), abs=1e-6)
    pv.closeness(["Tariff", "Export", "Roof"], centroid)  # past the cap: the cache starts over
    assert counting.calls == 2
    assert pv.closeness(["Solar panels"], centroid) == pytest.approx([direct[0]], abs=1e-6)
    assert PhraseVectors(_Counting(minilm, fail_short=True)).closeness(["Battery"], centroid) is None


def test_only_embedders_that_name_phrases_are_asked(minilm) -> None:  # type: ignore[no-untyped-def]
    assert phrase_vectors(HashEmbedder(), TreeSettings()) is None
    assert phrase_vectors(minilm, TreeSettings(title_vectors=False)) is None
    assert isinstance(phrase_vectors(minilm, TreeSettings()), PhraseVectors)


def test_theme_title_takes_the_nearest_of_its_best_candidates() -> None:
    kids = [{"battery": 5, "roof": 1}, {"battery": 4, "roof": 1}]
    df = {"battery": 2, "roof": 2}
    offline = labels.theme_title(kids, df, 40)
    assert offline == "Battery"

    def near(texts: Sequence[str]) -> list[float]:
        return [0.6 if t == "Roof" else 0.3 for t in texts]

    assert labels.theme_title(kids, df, 40, closeness=near) == "Roof"
    # No answer, or a wrong-sized one, keeps the offline pick.
    assert labels.theme_title(kids, df, 40, closeness=lambda texts: None) == offline
    assert labels.theme_title(kids, df, 40, closeness=lambda texts: [0.9]) == offline
    # A phrase that scored far below the best does not win on a little more closeness.
    kids = [{"battery": 40, "roof": 1}, {"battery": 40, "roof": 1}]
    assert labels.theme_title(kids, df, 40, closeness=lambda t: [0.50 if x == "Battery" else 0.55 for x in t]) \
        == "Battery"


def test_a_closed_one_off_at_the_top_is_titled_by_closeness(tmp_path, minilm) -> None:  # type: ignore[no-untyped-def]
    """Graham's crossword clue ("Superb ream of paper hides a fish (5)") is one closed
    exchange at the top level: by counts its title was "Superb ream", by closeness it is
    "Crossword clue". Topics that grew past one exchange keep the counts' title."""
    rows = _history("Graham")
    near = Memory(tmp_path / "near.db", embedder=minilm)
    off = Memory(tmp_path / "off.db", embedder=minilm, settings=default_settings(title_vectors=False))
    with near, off:
        tops = []
        for mem in (near, off):
            mem.add_many(_items(rows), user_id="u")
            check_tree(mem, "u")
            texts: dict[str, frozenset[str]] = {}
            for e in mem.exchanges(user_id="u"):
                texts[e.topic_id or ""] = texts.get(e.topic_id or "", frozenset()) | {e.text}
            tops.append({texts[t.id]: t for t in mem.tree(user_id="u").children if t.kind == "topic"})
        a, b = tops
        assert a.keys() == b.keys()  # the titles do not change the grouping
        one_offs = {k for k, t in a.items() if t.size == 1 and t.frozen}
        assert len(one_offs) >= 3
        crossword = next(k for k in one_offs if any("Crossword clue" in x for x in k))
        assert (b[crossword].title, a[crossword].title) == ("Superb ream", "Crossword clue")
        assert sum(a[k].title != b[k].title for k in one_offs) >= 3
        for k in a.keys() - one_offs:
            assert a[k].title == b[k].title, (a[k].title, b[k].title)


def test_a_theme_may_take_the_subject_word_only_one_child_says() -> None:
    """docs/titles.md, "The subject's own word": "I bought a ukulele" opens the subject, the
    next topics talk of chords and songs; the shared phrases alone titled the theme "Songs"."""
    kids = [{"ukulele": 4, "song": 1, "concert size": 1, "concert": 1, "size": 1, "tuner": 2, "kala": 2},
            {"song": 2, "chord": 3, "fingertips": 2, "calluses": 2},
            {"song": 2, "riptide": 2, "chord": 1, "group": 2, "library": 2, "strum": 2}]
    df = {"ukulele": 2, "song": 3, "chord": 2, "concert": 1, "size": 3, "riptide": 1}
    cosines = {"Ukulele": 0.51, "Song": 0.42, "Chord": 0.37, "Concert size": 0.60}

    def near(texts: Sequence[str]) -> list[float]:
        return [cosines.get(t, 0.1) for t in texts]

    assert labels.theme_title(kids, df, 40) == "Song"  # the offline pick: what the children share
    # "Concert size" is nearer still, but only two-word phrases made of the theme's best words
    # compete ("size" is not one of them): a child's side detail does not title its theme.
    assert labels.theme_title(kids, df, 40, closeness=near) == "Ukulele"


def test_a_theme_prefers_the_candidate_its_opening_message_names() -> None:
    """docs/titles.md, "The opening message": Kiri opens his subject with "im looking at a used
    ebike on trade me"; later visits keep returning to the battery, which sits nearest the
    theme's centroid. Named in the opening message, "Ebike" wins unless far less close."""
    kids = [{"battery": 4, "ebike": 2, "charger": 2, "bike": 1},
            {"battery": 3, "ebike": 1, "charger": 1, "range": 2}]
    df = {"battery": 2, "ebike": 2, "charger": 2, "bike": 3, "range": 2}
    cosines = {"Battery": 0.50, "Ebike": 0.36, "Charger": 0.34}

    def near(texts: Sequence[str]) -> list[float]:
        return [cosines.get(t, 0.1) for t in texts]

    opening = labels.opening_words("hey so im looking at a used ebike on trade me, guy says batery is fine")
    assert {"ebike", "used", "trade"} <= opening
    assert labels.theme_title(kids, df, 40, closeness=near) == "Battery"
    assert labels.theme_title(kids, df, 40, closeness=near, opening=opening) == "Ebike"
    # Offline (no closeness) the opening message is not read: the counts' pick stands.
    assert labels.theme_title(kids, df, 40, opening=opening) == labels.theme_title(kids, df, 40)
    # Named, but far less close than the nearest: the nearest stays.
    cosines["Ebike"] = 0.15
    assert labels.theme_title(kids, df, 40, closeness=near, opening=opening) == "Battery"
    # Plurals and possessives count as the word ("my daughter's exams" names "Exam").
    assert "exam" in labels.opening_words("My daughter's exams start in May")
    assert "daughter" in labels.opening_words("My daughter's exams start in May")


def test_a_topic_alone_at_the_top_prefers_what_its_opening_message_names(tmp_path, minilm) -> None:  # type: ignore[no-untyped-def]
    """docs/titles.md, "A topic's opening message": a blind history's knee injury (Jayden,
    benchmarks/data/subjects_check17.json), eight exchanges in one topic at the top level, was
    titled "Single leg" (squats said once: a phrase whose words never come alone has full
    cohesion) over "Knee", said in nearly every message. Its first message names the knee."""
    phrases = {"single leg": 3, "single": 3, "leg": 3, "knee": 16, "physio": 15, "mcl sprain": 4, "mcl": 7, "sprain": 6}
    df = {"single": 1, "leg": 1, "knee": 8, "physio": 6, "mcl": 5, "sprain": 5}
    assert labels.make_title(phrases, df, 48, members=8) == "Single leg"
    opening = labels.opening_words("hurt my knee at footy on saturday, twisted it landing")
    assert labels.make_title(phrases, df, 48, members=8, opening=opening) == "Knee"
    # With closeness (themes, one-offs) the opening message weighs the closeness instead.
    assert labels.make_title(phrases, df, 48, members=8, opening=opening, closeness=lambda t: None) == "Single leg"
    with Memory(tmp_path / "j.db", embedder=minilm) as mem:
        mem.add_many(_items(history("subjects_check17.json", "Jayden")), user_id="u")
        check_tree(mem, "u")
        tops = {c.title for c in mem.tree(user_id="u").children}
    assert "Knee" in tops and "Single leg" not in tops, tops


def test_a_two_word_phrase_of_the_opening_message_is_a_candidate() -> None:
    """"Fly fishing" is said once, in the opening message; "fishing" is not among the theme's
    best words, so the phrase was no candidate and the theme read "Trout". A two-word phrase
    the opening message holds whole, with one of the best words in it, now competes."""
    kids = [{"trout": 4, "fly": 3, "fly fishing": 1, "fishing": 1, "rod": 3, "river": 3, "wader": 2, "cast": 2},
            {"trout": 3, "fly": 2, "reel": 3, "river": 2, "licence": 2, "knot": 2, "tippet": 2, "line": 2}]
    df = dict.fromkeys(["trout", "fly", "fishing", "rod", "river", "wader", "cast", "reel", "licence",
                        "knot", "tippet", "line"], 2)
    cosines = {"Fly fishing": 0.62, "Trout": 0.5, "Fly": 0.3, "River": 0.35}

    def near(texts: Sequence[str]) -> list[float]:
        return [cosines.get(t, 0.1) for t in texts]

    opening = labels.opening_words("I'd like to take up fly fishing this spring, where do I start?")
    assert labels.theme_title(kids, df, 40, closeness=near) == "Trout"
    assert labels.theme_title(kids, df, 40, closeness=near, opening=opening) == "Fly fishing"
    # A phrase of the opening message with none of the theme's best words is no candidate.
    opening = labels.opening_words("Spring plans: fly fishing, and my licence knot")
    kids[0]["spring plans"] = 1
    cosines["Spring plans"] = 0.9
    assert labels.theme_title(kids, df, 40, closeness=near, opening=opening) == "Fly fishing"


def test_a_theme_may_take_a_phrase_of_two_of_its_best_words() -> None:
    kids = [{"hip": 3, "replacement": 3, "hip replacement": 3, "surgeon": 2},
            {"hip": 2, "surgeon": 2, "physio": 2}, {"surgeon": 1, "crutches": 2, "hip": 1}]
    df = {"hip": 3, "replacement": 2, "surgeon": 3, "physio": 1, "crutches": 1}
    cosines = {"Hip replacement": 0.62, "Hip": 0.45, "Surgeon": 0.48}
    assert labels.theme_title(kids, df, 40, closeness=lambda t: [cosines.get(x, 0.1) for x in t]) \
        == "Hip replacement"


def _demo_themes(path: Path, embedder: Embedder, *, consolidate: bool) -> dict[str, list[str]]:
    """The bundled demo's top-level themes (title -> children's titles), as placed or after
    one consolidation run."""
    demo = json.loads(resources.files("arbormem").joinpath("data/demo.json").read_text("utf-8"))
    with Memory(path, embedder=embedder) as mem:
        mem.add_many(demo["exchanges"], user_id="u")
        if consolidate:
            mem.consolidate("u")
        check_tree(mem, "u")
        return {c.title: [k.title for k in c.children] for c in mem.tree(user_id="u").children
                if c.kind == "theme"}


def test_the_demo_allergy_theme_names_the_allergy(tmp_path, minilm) -> None:  # type: ignore[no-untyped-def]
    """The bundled demo with the real model: the theme holding Leo's allergy was titled "Leo"
    (the only phrase its two children share), now "Peanut allergy"."""
    themes = _demo_themes(tmp_path / "demo.db", minilm, consolidate=False)
    assert "Peanut allergy" in themes, themes
    assert "Severe peanut allergy" in themes["Peanut allergy"]


def test_the_demo_party_theme_is_named_as_its_opening_message_names_it(tmp_path, minilm) -> None:  # type: ignore[no-untyped-def]
    """After consolidation the demo's party theme was titled "Fossil dig" (a detail of one
    visit, nearest the centroid), its first child "Daughter Maya"; the opening message ("I
    want to throw her a party at home") names the party."""
    themes = _demo_themes(tmp_path / "demo.db", minilm, consolidate=True)
    assert "Party" in themes, themes
    assert "Fossil dig" in themes["Party"]


def test_no_topic_is_titled_with_a_part_of_its_theme_s_title(tmp_path, minilm) -> None:  # type: ignore[no-untyped-def]
    """A blind history (benchmarks/data/subjects_check11.json): once the mother's hearing-aid
    theme was titled "Hearing aids", a child read "Hearing", which says nothing the theme
    does not; it now takes its next phrase, as a child titled exactly as its theme does."""
    rows = history("subjects_check11.json", "Anneke")
    with Memory(tmp_path / "a.db", embedder=minilm) as mem:
        mem.add_many(_items(rows), user_id="u")
        mem.consolidate("u")
        check_tree(mem, "u")
        pairs = [(n.title, c.title) for n in mem.tree(user_id="u").walk() if n.kind == "theme" for c in n.children]
    assert ("Hearing aids", "Hearing") not in pairs
    assert "Hearing aids" in {t for t, _ in pairs}
    assert not [p for p in pairs if labels.repeats(p[1], p[0])], pairs


def test_no_two_topics_of_a_theme_share_a_title(tmp_path, minilm) -> None:  # type: ignore[no-untyped-def]
    """Two blind histories: Ellie's driving lessons (benchmarks/data/subjects_check15.json) held
    two topics titled "Theory test" once the theme took "Driving lesson" from the older one (a
    bulk write titles the newer first); Gord's hens (subjects_check18.json) met an "Honour
    box" topic beside an "Honour box" sub-theme moved there by consolidation. The smaller of two
    siblings with one title takes its next phrase (docs/titles.md, "Siblings")."""
    for file, name, before in (("subjects_check15.json", "Ellie", "Theory test"), ("subjects_check18.json", "Gord", "Honour box")):
        with Memory(tmp_path / f"{name}.db", embedder=minilm) as mem:
            mem.add_many(_items(history(file, name)), user_id="u")
            for _ in range(2):
                check_tree(mem, "u")
                titles = [n.title for n in mem.tree(user_id="u").walk()]
                assert before in titles
                for node in mem.tree(user_id="u").walk():
                    if node.kind == "theme":
                        keys = [labels.title_key(c.title) for c in node.children]
                        assert len(keys) == len(set(keys)), (node.title, [c.title for c in node.children])
                mem.consolidate("u")
