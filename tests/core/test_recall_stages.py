"""Recall's per-stage clock, and its lexical searches run alongside the query embedding: the
same context either way, on a real SQLite file and a real PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

from arbormem import Memory
from arbormem.embed.testing import HashEmbedder
from arbormem.store.sqlite import SQLiteStore
from tests.conftest import chat

STAGES = {"query", "embed", "indexes", "fuse", "expand", "pack", "render", "total"}


class _Inline(SQLiteStore):
    """A real SQLite store that declines reads from another thread: recall runs inline."""

    def reads_alongside(self) -> bool:
        return False


def _fill(mem: Memory) -> None:
    mem.add_many([{"messages": chat(f"My {w} plans for week {i}", f"Noted the {w} plan {i}.")}
                  for i, w in enumerate(["violin", "garden", "taxes", "violin", "bicycle", "garden"] * 5)],
                 user_id="u")


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_lexical_searches_alongside_the_embedding_give_the_same_recall(
        store: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if store == "sqlite":
        mem = Memory(tmp_path / "m.db", embedder=HashEmbedder())
        _fill(mem)
        inline = Memory(store=_Inline(tmp_path / "m.db"), embedder=HashEmbedder())
    else:
        url = request.getfixturevalue("pg_database")
        mem = Memory(database_url=url, embedder=HashEmbedder())
        _fill(mem)
        inline = None
    try:
        assert mem.store.reads_alongside()
        for q in ("violin plans", "garden week 3", "nothing like this"):
            r = mem.recall(q, user_id="u", max_tokens=300, min_relevance=0)
            assert STAGES <= set(r.trace.timings_ms) and "lexical" in r.trace.timings_ms
            if inline is not None:
                r2 = inline.recall(q, user_id="u", max_tokens=300, min_relevance=0)
                assert (r2.text, r2.trace.exchange_scores) == (r.text, r.trace.exchange_scores)
        # inside a transaction another connection would not see its writes: recall runs inline
        with mem.store.transaction("u"):
            assert not mem.store.reads_alongside()
            assert mem.recall("violin plans", user_id="u", max_tokens=300, min_relevance=0).exchanges
    finally:
        mem.close()
        if inline is not None:
            inline.close()


def test_only_short_texts_have_their_tokens_kept() -> None:
    """Recall keeps the tokens of short texts for the process; a long one (a pasted document)
    is tokenised each time, with the same result, so the caches stay small."""
    from arbormem.retrieve import reader
    from arbormem.text import index_tokens, term_counts

    short = "Planting garlic before the first frost"
    long = " ".join(f"paragraph{i} about soil and compost" for i in range(400))
    assert len(long) > reader._KEPT_CHARS
    before = (reader._token_set.cache_info().currsize, reader._term_counts.cache_info().currsize)
    assert reader.token_set(long) == frozenset(index_tokens(long))
    assert reader.text_term_counts(long) == term_counts(long)
    assert (reader._token_set.cache_info().currsize, reader._term_counts.cache_info().currsize) == before
    assert reader.token_set(short) == frozenset(index_tokens(short))
    assert reader.text_term_counts(short) == term_counts(short)
    hits = reader._token_set.cache_info().hits
    reader.token_set(short)  # kept: the second call is a hit
    assert reader._token_set.cache_info().hits == hits + 1
