"""PostgreSQL lexical search: the path for very common terms ranks like the exact path."""

from __future__ import annotations

import pytest

import arbormem.store.postgres as pg
from arbormem.models import Exchange

from .test_contract import ex


@pytest.fixture
def store(pg_database: str):
    s = pg.PostgresStore(pg_database, max_size=2)
    yield s
    s.close()


def test_common_terms_past_the_postings_cap(store: pg.PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    bodies = [f"garden note {i} " + ("tomato " * (i % 3)) + ("basil" if i in (4, 9) else "") for i in range(30)]
    for i, body in enumerate(bodies, start=1):
        e: Exchange = ex("u", i, body)
        store.insert_exchange(e)
        store.put_text("u", "exchange", e.id, body)
    queries = (["garden", "basil"], ["tomato", "basil"], ["garden", "tomato"], ["garden"])
    exact = {q: store.text_search("u", "exchange", list(q), 5) for q in map(tuple, queries)}
    monkeypatch.setattr(pg, "_POSTINGS_CAP", 3)  # "garden" and "tomato" are now common terms
    for q, want in exact.items():
        got = store.text_search("u", "exchange", list(q), 5)
        if "basil" in q:  # a rare term: its candidates scored exactly as before
            assert got[:2] == want[:2]
            assert {i for i, _ in got[:2]} == {"e_u_5", "e_u_10"}
        else:  # only common terms: scored on a bounded candidate set, never overrated
            assert len(got) == 5
            full = dict(store.text_search("u", "exchange", list(q), 100))
            for item_id, score in got:
                assert score <= full[item_id] + 1e-9
            if len(q) == 1:  # one term: its postings carry every score exactly
                assert all(score == pytest.approx(full[i]) for i, score in got)


def test_sampled_document_frequencies(store: pg.PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(1, 41):
        body = f"river {'bridge ' * (i % 4)}walk {i}" + (" otter" if i % 10 == 0 else "")
        store.insert_exchange(ex("u", i, body))
        store.put_text("u", "exchange", f"e_u_{i}", body)
    query = ["river", "bridge", "otter"]
    monkeypatch.setattr(pg, "_POSTINGS_CAP", 5)  # river and bridge are common
    counted = store.text_search("u", "exchange", query, 5)
    assert {i for i, _ in counted[:4]} == {"e_u_10", "e_u_20", "e_u_30", "e_u_40"}
    # a big partition estimates them from a page sample; a sample of every page is exact
    store._df_cache.clear()
    monkeypatch.setattr(pg, "_EXACT_DF_DOCS", 0)
    monkeypatch.setattr(pg, "_DF_SAMPLE", 10**6)
    assert store.text_search("u", "exchange", query, 5) == counted
    assert store._df_cache[("u", "exchange", "river")] == (40, 40)
