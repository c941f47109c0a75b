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
