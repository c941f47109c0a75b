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


_WORDY = [
    ("Café naïve résumé: what's the plan for O'Neil's birthday?", "Book the café for Saturday; O'Neil likes crêpes."),
    ("My daughter's violin recital is on the 12th", ""),
    ("Pasted notes: " + "the garden hose leaks near the tap, " * 80, "Replace the washer in the tap connector."),
    ("Tax return: self-assessment deadline 31 January", "File online before midnight on 31 January."),
]


def test_recall_reads_the_tokens_kept_at_write_and_older_rows_recall_the_same(tmp_path: Path) -> None:
    """Coverage and feedback read the words the store kept when each exchange was written
    (``text.token_record``, SQLite migration 5). A memory from before that migration (no
    column, then NULL rows) is migrated on open, loses nothing and recalls exactly the same."""
    import sqlite3

    from arbormem.models import exchange_text
    from arbormem.retrieve.reader import ExchangeReader
    from arbormem.text import index_tokens, term_counts

    db = tmp_path / "m.db"
    queries = ("violin recital", "O'Neil café birthday", "garden tap washer", "tax deadline January")
    with Memory(db, embedder=HashEmbedder()) as mem:
        _fill(mem)
        mem.add_many([{"messages": chat(u, a) if a else [{"role": "user", "content": u}]} for u, a in _WORDY],
                     user_id="u")
        before = [(r.text, r.trace.exchange_scores) for r in
                  (mem.recall(q, user_id="u", max_tokens=300, min_relevance=0) for q in queries)]
        exchanges = mem.exchanges(user_id="u")
        reader = ExchangeReader(mem.store, "u")
        texts = reader.texts([e.id for e in exchanges])
        assert all(t.tokens is not None for t in texts.values())
        for e in exchanges:  # the kept words are the texts' own
            assert reader.index_tokens(e.id, 0) == frozenset(index_tokens(e.user_text))
            assert reader.index_tokens(e.id, 1) == frozenset(index_tokens(e.assistant_text))
            assert reader.term_counts(e.id) == term_counts(exchange_text(e.user_text, e.assistant_text))
    # Back to schema 4: no column, no record of migration 5.
    with sqlite3.connect(db) as conn:
        conn.execute("ALTER TABLE exchanges DROP COLUMN tokens")
        conn.execute("DELETE FROM schema_migrations WHERE version = 5")
    with Memory(db, embedder=HashEmbedder()) as mem:
        assert len(mem.exchanges(user_id="u")) == len(exchanges)
        texts = ExchangeReader(mem.store, "u").texts([e.id for e in exchanges])
        assert all(t.tokens is None for t in texts.values())  # tokenised when read, as before
        after = [(r.text, r.trace.exchange_scores) for r in
                 (mem.recall(q, user_id="u", max_tokens=300, min_relevance=0) for q in queries)]
    assert after == before
