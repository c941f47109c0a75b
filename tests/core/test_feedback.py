"""The feedback step of recall: the best exchanges' distinctive terms make a second BM25 query
that lifts the tail of the ranking, while the head keeps its places."""

from __future__ import annotations

from pathlib import Path

from arbormem import Memory
from arbormem.config import RecallSettings, Settings
from arbormem.embed.testing import HashEmbedder
from tests.conftest import chat

QUERY = "violin lessons"
HIT = chat("My violin lessons started today.", "Which pieces? Grieg sonatas with the metronome?")
# Shares no word with the query, but two of the hit's distinctive words ("grieg", "metronome").
LINKED = chat("The Grieg recording arrived.", "Use the metronome, it helps.")
UNLINKED = chat("The garden recording arrived.", "Use the watering can, it helps.")
FILLER = [chat(f"Filler question {i} about {w}?", f"Filler answer {i} on {w}.")
          for i, w in enumerate(["tomatoes", "bicycles", "taxes", "weather", "printers", "curtains"])]


def _memory(path: Path) -> None:
    # One session per exchange: lexical keys carry same-session neighbours' text, which would
    # put the hit's words into the other exchanges' keys too.
    with Memory(path, embedder=HashEmbedder()) as mem:
        items = [*FILLER, HIT, LINKED, UNLINKED]
        mem.add_many([{"messages": m, "session_id": f"s{i}"} for i, m in enumerate(items)], user_id="u")


def _scores(path: Path, **settings: float) -> dict[str, float]:
    s = Settings(recall=RecallSettings(coverage_weight=0.0, feedback_docs=1, **settings))
    with Memory(path, embedder=HashEmbedder(), settings=s) as mem:
        return {h.exchange.user_text: h.score for h in mem.search(QUERY, user_id="u", limit=20)}


def test_feedback_lifts_exchanges_that_share_the_best_hits_terms(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    _memory(path)
    off = _scores(path, feedback_weight=0.0)
    on = _scores(path, feedback_weight=0.8, feedback_keep=1)
    hit, linked, unlinked = HIT[0]["content"], LINKED[0]["content"], UNLINKED[0]["content"]
    assert max(off, key=lambda t: off[t]) == hit == max(on, key=lambda t: on[t])
    # Same length and shape: only the feedback query tells the two apart.
    assert on[linked] - on[unlinked] > off[linked] - off[unlinked] + 0.5
    with Memory(path, embedder=HashEmbedder(), settings=Settings(recall=RecallSettings(
            coverage_weight=0.0, feedback_docs=1, feedback_keep=1))) as mem:
        sources = {h.exchange.user_text: h.sources for h in mem.search(QUERY, user_id="u", limit=20)}
    assert "feedback" in sources[linked] and "feedback" not in sources[unlinked]


def test_the_head_keeps_its_order(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    _memory(path)
    linked = LINKED[0]["content"]

    def order(scores: dict[str, float]) -> list[str]:
        return sorted(scores, key=lambda t: -scores[t])

    off = order(_scores(path, feedback_weight=0.0))
    assert off[0] == HIT[0]["content"] and off[1] != linked
    # With a heavy weight the linked exchange overtakes everything in the tail...
    assert order(_scores(path, feedback_weight=5.0, feedback_keep=1))[:2] == [off[0], linked]
    # ...but never the head: with two kept, the two best stay first, in their order.
    assert order(_scores(path, feedback_weight=5.0, feedback_keep=2))[:3] == [off[0], off[1], linked]
