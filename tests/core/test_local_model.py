"""The embedded default end to end: the bundled MiniLM, offline, on the shipped demo."""

from __future__ import annotations

import json

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


def test_the_direct_loader_gives_sentence_transformers_vectors(minilm, demo_data) -> None:
    """embed/bert.py runs the bundled model without sentence-transformers: the vectors must be
    the ones sentence-transformers gives (a memory built by either is the same memory)."""
    import numpy as np
    import pytest

    from arbormem.embed.bert import BertEncoder, supported
    from arbormem.embed.local import SentenceTransformerEncoder, bundled_model_path

    path = bundled_model_path()
    assert supported(path) and isinstance(minilm._model, BertEncoder)
    texts = [e["messages"][0]["content"] for e in demo_data["exchanges"]]
    texts += ["x", "Ünïcödé 日本語のテキスト 🙂 ok", "word " * 700,  # past the 256-token limit
              "a\n\nb\tc", json.dumps({"k": [1, 2, {"z": "deep"}]})]
    ours = minilm.embed(texts)
    ref = pytest.importorskip("sentence_transformers") and SentenceTransformerEncoder(path).encode(texts, 16)
    assert ours.shape == ref.shape == (len(texts), 384)
    assert float(np.abs(ours - ref).max()) < 1e-5
    # Batching does not change a vector (padding is masked out).
    alone = np.vstack([minilm.embed([t]) for t in texts[:6]])
    assert float(np.abs(alone - ours[:6]).max()) < 1e-5
