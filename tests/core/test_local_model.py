"""The embedded default end to end: the bundled MiniLM, offline, on the shipped demo."""

from __future__ import annotations

from arbormem import Memory


def test_demo_cross_branch_recall_with_minilm(tmp_path, minilm, demo_data) -> None:
    with Memory(tmp_path / "demo.db", embedder=minilm) as mem:
        mem.add_many(demo_data["exchanges"], user_id="demo")
        r = mem.recall(demo_data["question"], user_id="demo", max_tokens=500)
        assert r.tokens <= 500
        # The answer spans branches: the party plans and the guests' allergies.
        assert "peanut allergy" in r.text
        assert "dinosaur" in r.text.lower() or "party at home" in r.text
        assert len({t.parent_id for t in r.topics}) >= 1 and len(r.topics) >= 2
        # Reopening with the same model works; a different model is refused (tested elsewhere).
    with Memory(tmp_path / "demo.db", embedder=minilm) as mem:
        assert mem.search("Japan trip in October", user_id="demo")[0].exchange.user_text.startswith("I'm planning a trip to Japan")


def test_relevance_floor_with_minilm(minilm) -> None:
    """The issue's cases with the bundled model and its calibrated floor (issue 18)."""
    notes = ["Kafka interview notes: partitions, consumer groups and offsets",
             "Rust error handling with the question mark operator and thiserror",
             "The induction hob needs flat bottomed pans, cast iron works",
             "The boiler code is 4471, the engineer comes on Tuesday",
             "Maya's birthday party: a dinosaur cake and a bouncy castle"]
    with Memory(":memory:", embedder=minilm) as mem:
        for i, n in enumerate(notes):
            mem.add([{"role": "user", "content": n}, {"role": "assistant", "content": "Noted."}],
                    user_id="u", session_id=f"s{i}")
        assert mem.search("zzzqqq", user_id="u") == []
        r = mem.recall("zzzqqq", user_id="u", recent=0)
        assert r.exchanges == () and "no exchange reached" in r.trace.stopped
        r = mem.recall("What is the boiler code?", user_id="u", recent=0)
        assert [e.user_text for e in r.exchanges] == [notes[3]]
        assert mem.search("What is the boiler code?", user_id="u")[0].exchange.user_text == notes[3]
        assert len(mem.recall("What is the boiler code?", user_id="u", recent=0, min_relevance=0).exchanges) == 5
