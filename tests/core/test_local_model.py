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
