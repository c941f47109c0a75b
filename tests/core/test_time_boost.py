"""Time windows in recall: exchanges inside the query's window gain time_boost, and
dated_boost instead when the query names a day (the window is then the week up to it)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from arbormem import Memory
from arbormem.config import RecallSettings, Settings
from arbormem.embed.testing import HashEmbedder
from tests.conftest import chat

SAID = chat("I repotted the fern on the balcony.", "Nice, ferns like shade.")


def _margin(path: Path, query: str, **recall: float) -> float:
    """score(the June exchange) - score(the same words in September)."""
    with Memory(path, embedder=HashEmbedder(), settings=Settings(recall=RecallSettings(**recall))) as mem:
        hits = mem.search(query, user_id="u", limit=10)
    by_month = {h.exchange.user_at.month: h.score for h in hits}
    return by_month[6] - by_month[9]


def test_a_named_day_lifts_its_week_more_than_a_month_does(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    with Memory(path, embedder=HashEmbedder()) as mem:
        mem.add_many([
            {"messages": SAID, "session_id": "june", "at": datetime(2023, 6, 2, 10, tzinfo=timezone.utc)},
            {"messages": SAID, "session_id": "sept", "at": datetime(2023, 9, 2, 10, tzinfo=timezone.utc)},
            {"messages": chat("Anything else?", "No."), "session_id": "later",
             "at": datetime(2023, 10, 1, tzinfo=timezone.utc)},
        ], user_id="u")
    # The two copies score alike but for the window: the change in margin is the boost.
    day, month = "What did I repot, as mentioned on 3 June, 2023?", "What did I repot in June 2023?"
    assert abs(_margin(path, day) - _margin(path, day, dated_boost=0.0) - 3.0) < 1e-6
    assert abs(_margin(path, month) - _margin(path, month, time_boost=0.0) - 0.5) < 1e-6
    assert abs(_margin(path, month) - _margin(path, month, dated_boost=0.0)) < 1e-6  # not a named day
