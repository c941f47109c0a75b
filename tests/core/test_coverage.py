"""The coverage step of recall: an exchange whose single message holds all of the query's terms
gains more than one where the same terms are spread over its two messages."""

from __future__ import annotations

from pathlib import Path

from arbormem import Memory
from arbormem.config import RecallSettings, Settings
from arbormem.embed.testing import HashEmbedder
from arbormem.text import index_tokens, stem
from tests.conftest import chat

QUERY = "violin recital programme"
SPREAD = chat("Which violin piece should I play?", "For the recital programme I picked Bach.")  # 2 of 3 in one message
TOGETHER = chat("What's new with you?", "My violin recitals' programmes are printed.")  # 3 of 3, other word forms


def _margin(path: Path, weight: float) -> float:
    """score(TOGETHER) - score(SPREAD) in search, with the coverage step at ``weight``."""
    settings = Settings(recall=RecallSettings(coverage_weight=weight))
    with Memory(path, embedder=HashEmbedder(), settings=settings) as mem:
        hits = {h.exchange.user_text: h.score for h in mem.search(QUERY, user_id="u", limit=20)}
    return hits[TOGETHER[0]["content"]] - hits[SPREAD[0]["content"]]


def test_coverage_lifts_the_message_that_holds_every_query_term(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    with Memory(path, embedder=HashEmbedder()) as mem:
        mem.add_many([{"messages": chat(f"Filler question {i} about gardening.", f"Filler answer {i}.")}
                      for i in range(6)] + [{"messages": SPREAD}, {"messages": TOGETHER}], user_id="u")
    without, with_ = _margin(path, 0.0), _margin(path, 3.0)
    # Best message shares: TOGETHER 3/3 (stems match "recitals'", "programmes"), SPREAD 2/3.
    assert abs((with_ - without) - 3.0 * (1 - 2 / 3)) < 1e-6


def test_stems_match_the_lexical_index() -> None:
    # The coverage step compares Porter stems, as FTS5's porter tokenizer indexes them.
    assert stem("programmes") == stem("programme") == "programm"
    assert stem("families") == stem("family")
    assert index_tokens("Café RECITALS, 2023") == ["cafe", "recit", "2023"]
    assert stem("is") == "is" and stem("ßx") == "ßx"  # short and non-ASCII words pass through


def test_query_terms_are_tokenised_like_the_messages(tmp_path: Path) -> None:
    # An accented, apostrophised query term covers the message that spells it the same way:
    # both sides go through the index tokenizer ("café" -> "cafe", "o'neil" -> "o", "neil").
    path = tmp_path / "memory.db"
    with Memory(path, embedder=HashEmbedder()) as mem:
        mem.add_many([{"messages": chat("Lunch at Café O'Neil today?", "Sounds good.")},
                      {"messages": chat("Anything else?", "No.")}], user_id="u")
    scores = []
    for weight in (0.0, 3.0):
        with Memory(path, embedder=HashEmbedder(), settings=Settings(recall=RecallSettings(coverage_weight=weight))) as m:
            hits = {h.exchange.user_text: h.score for h in m.search("Café O'Neil", user_id="u", limit=5)}
            scores.append(hits["Lunch at Café O'Neil today?"] - hits["Anything else?"])
    assert abs((scores[1] - scores[0]) - 3.0) < 1e-6  # every query token is in that one message
