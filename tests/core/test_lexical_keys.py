"""Lexical keys (an exchange's text plus its same-session neighbours') and term statistics come
out the same whether exchanges arrive one by one or in a bulk batch, where each key is written
once and the statistics updated once per batch."""

from __future__ import annotations

from pathlib import Path

from arbormem import Memory
from arbormem.embed.testing import HashEmbedder
from tests.conftest import chat

WORDS = "kayak glacier violin sourdough invoice marathon lantern orchard comet harbour".split()


def _items() -> list[dict]:
    # Three sessions; each exchange names two words, so a word's hits reveal whose keys hold it.
    return [{"messages": chat(f"tell me about {WORDS[i % 10]}", f"noted {WORDS[(i * 3 + 1) % 10]}"),
             "session_id": f"s{i // 5}"} for i in range(14)]


def _lexical(mem: Memory) -> tuple[dict[str, list[tuple[int, float]]], dict[str, int]]:
    seq = {e.id: e.seq for e in mem.store.iter_exchanges("u")}
    hits = {w: sorted((seq[i], round(score, 6)) for i, score in mem.store.text_search("u", "exchange", [w], 50))
            for w in WORDS}
    return hits, mem.store.get_term_df("u", [*WORDS, "tell", "noted"])


def test_bulk_and_one_by_one_ingest_write_the_same_keys(tmp_path: Path) -> None:
    with Memory(tmp_path / "one.db", embedder=HashEmbedder()) as one:
        for item in _items():
            one.add(item["messages"], user_id="u", session_id=item["session_id"])
        expected = _lexical(one)
    with Memory(tmp_path / "bulk.db", embedder=HashEmbedder()) as bulk:
        bulk.add_many(_items()[:6], user_id="u", batch_size=4)  # batch edges inside a session
        bulk.add_many(_items()[6:], user_id="u", batch_size=5)
        got = _lexical(bulk)
    assert got == expected
    # Keys do span neighbours: "kayak" (exchange 1) is found at 1 and at its neighbour 2.
    assert [s for s, _ in expected[0]["kayak"]][:2] == [1, 2]
    assert expected[1]["tell"] == 14 and expected[1]["kayak"] == 4  # exchanges holding the term
