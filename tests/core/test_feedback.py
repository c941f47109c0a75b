"""The feedback step of recall: the best exchanges' distinctive terms make a second BM25 query
that lifts the tail of the ranking, while the head keeps its places. On SQLite and on a real
PostgreSQL: the step reads exchanges and term frequencies through the store contract."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

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


Open = Callable[..., Memory]


@pytest.fixture(params=["sqlite", "postgres"])
def open_memory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Open]:
    """Opens Memory instances on one fresh database of the parametrised store, and writes the
    test's exchanges there first."""
    where: dict[str, Any] = ({"path": tmp_path / "memory.db"} if request.param == "sqlite"
                             else {"database_url": request.getfixturevalue("pg_database")})

    def open_(**kw: Any) -> Memory:
        return Memory(**where, embedder=HashEmbedder(), **kw)

    # One session per exchange: lexical keys carry same-session neighbours' text, which would
    # put the hit's words into the other exchanges' keys too.
    with open_() as mem:
        items = [*FILLER, HIT, LINKED, UNLINKED]
        mem.add_many([{"messages": m, "session_id": f"s{i}"} for i, m in enumerate(items)], user_id="u")
    yield open_


def _scores(open_memory: Open, **settings: float) -> dict[str, float]:
    s = Settings(recall=RecallSettings(coverage_weight=0.0, feedback_docs=1, **settings))
    with open_memory(settings=s) as mem:
        return {h.exchange.user_text: h.score for h in mem.search(QUERY, user_id="u", limit=20)}


def test_feedback_lifts_exchanges_that_share_the_best_hits_terms(open_memory: Open) -> None:
    off = _scores(open_memory, feedback_weight=0.0)
    on = _scores(open_memory, feedback_weight=0.8, feedback_keep=1)
    hit, linked, unlinked = HIT[0]["content"], LINKED[0]["content"], UNLINKED[0]["content"]
    assert max(off, key=lambda t: off[t]) == hit == max(on, key=lambda t: on[t])
    # Same length and shape: only the feedback query tells the two apart.
    assert on[linked] - on[unlinked] > off[linked] - off[unlinked] + 0.5
    with open_memory(settings=Settings(recall=RecallSettings(
            coverage_weight=0.0, feedback_docs=1, feedback_keep=1))) as mem:
        sources = {h.exchange.user_text: h.sources for h in mem.search(QUERY, user_id="u", limit=20)}
    assert "feedback" in sources[linked] and "feedback" not in sources[unlinked]


def test_the_head_keeps_its_order(open_memory: Open) -> None:
    linked = LINKED[0]["content"]

    def order(scores: dict[str, float]) -> list[str]:
        return sorted(scores, key=lambda t: -scores[t])

    off = order(_scores(open_memory, feedback_weight=0.0))
    assert off[0] == HIT[0]["content"] and off[1] != linked
    # With a heavy weight the linked exchange overtakes everything in the tail...
    assert order(_scores(open_memory, feedback_weight=5.0, feedback_keep=1))[:2] == [off[0], linked]
    # ...but never the head: with two kept, the two best stay first, in their order.
    assert order(_scores(open_memory, feedback_weight=5.0, feedback_keep=2))[:3] == [off[0], off[1], linked]
