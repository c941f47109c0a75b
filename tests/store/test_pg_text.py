"""PostgreSQL lexical search: the path for very common terms ranks like the exact path."""

from __future__ import annotations

import numpy as np
import psycopg
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


def _recorded(url: str) -> dict[tuple[str, str], tuple[int, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT kind, lexeme, df, n_docs FROM arbormem_text_df WHERE user_id = 'u'").fetchall()
    return {(k, lex): (int(df), int(n)) for k, lex, df, n in rows}


def _forget(url: str) -> None:
    with psycopg.connect(url) as conn:
        conn.execute("DELETE FROM arbormem_text_df")


def _rivers(store: pg.PostgresStore) -> None:
    for i in range(1, 41):
        body = f"river {'bridge ' * (i % 4)}walk {i}" + (" otter" if i % 10 == 0 else "")
        store.insert_exchange(ex("u", i, body))
        store.put_text("u", "exchange", f"e_u_{i}", body)


def test_sampled_document_frequencies(store: pg.PostgresStore, pg_database: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _rivers(store)
    query = ["river", "bridge", "otter"]
    monkeypatch.setattr(pg, "_POSTINGS_CAP", 5)  # river and bridge are common
    counted = store.text_search("u", "exchange", query, 5)
    assert {i for i, _ in counted[:4]} == {"e_u_10", "e_u_20", "e_u_30", "e_u_40"}
    assert _recorded(pg_database) == {("exchange", "river"): (40, 40), ("exchange", "bridg"): (30, 40)}  # stemmed
    # a big partition estimates them from a page sample; a sample of every page is exact
    _forget(pg_database)
    monkeypatch.setattr(pg, "_EXACT_DF_DOCS", 0)
    monkeypatch.setattr(pg, "_DF_SAMPLE", 10**6)
    assert store.text_search("u", "exchange", query, 5) == counted
    assert _recorded(pg_database)[("exchange", "river")] == (40, 40)


def test_recorded_document_frequencies_hold_until_the_partition_changes(
        store: pg.PostgresStore, pg_database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A search reads a common term's recorded frequency instead of counting its postings
    # (which grow with the partition), from any process, while the partition is at most 10%
    # bigger than when it was recorded.
    _rivers(store)
    query = ["river", "bridge", "otter"]
    monkeypatch.setattr(pg, "_POSTINGS_CAP", 5)
    counted = store.text_search("u", "exchange", query, 40)
    with psycopg.connect(pg_database) as conn:  # as if river had been in 20 of the 40 then
        conn.execute("UPDATE arbormem_text_df SET df = 20 WHERE lexeme = 'river'")
    other = pg.PostgresStore(pg_database, max_size=1)
    try:
        trusted = dict(other.text_search("u", "exchange", query, 40))
    finally:
        other.close()
    assert trusted["e_u_1"] > dict(counted)["e_u_1"]  # the recorded (higher) idf was used
    for i in range(41, 45):  # 10% more documents: still trusted
        store.insert_exchange(ex("u", i, "a lake"))
        store.put_text("u", "exchange", f"e_u_{i}", "a lake")
    store.text_search("u", "exchange", query, 5)
    assert _recorded(pg_database)[("exchange", "river")] == (20, 40)
    store.put_text("u", "exchange", "e_u_41", "river again")  # an update, not a new document
    store.insert_exchange(ex("u", 45, "a pond"))
    store.put_text("u", "exchange", "e_u_45", "a pond")  # 45 > 40 * 1.1: counted again
    store.text_search("u", "exchange", query, 5)
    assert _recorded(pg_database)[("exchange", "river")] == (41, 45)
    store.delete_exchange("e_u_45")  # a smaller partition (deletions): counted again
    store.text_search("u", "exchange", query, 5)
    assert _recorded(pg_database)[("exchange", "river")] == (41, 44)
    with store.transaction("u"):  # a forget purges what was recorded before it
        store.delete_exchange("e_u_44")
        store.purge_deleted_text()
    assert _recorded(pg_database) == {}
    store.delete_user("u")
    assert _recorded(pg_database) == {}


def test_a_bulk_load_records_the_common_terms(store: pg.PostgresStore, pg_database: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg, "_POSTINGS_CAP", 3)
    bodies = [f"garden note {i} " + ("tomato " * (i % 3)) + ("basil" if i in (4, 9) else "") for i in range(1, 31)]
    exchanges = [ex("u", i, body) for i, body in enumerate(bodies, start=1)]
    vectors = np.random.default_rng(1).normal(size=(len(bodies), 8)).astype(np.float32)
    store.load_exchanges("u", exchanges, vectors, bodies)
    store.finish_load("u")
    # "garden" and "note" are in all 30, "tomato" in 20: past the cap (counted exactly in a
    # partition this small); "basil" in 2 is rare
    assert _recorded(pg_database) == {("exchange", "garden"): (30, 30), ("exchange", "note"): (30, 30),
                                      ("exchange", "tomato"): (20, 30)}
    query = ["garden", "tomato", "basil"]
    loaded = store.text_search("u", "exchange", query, 10)
    _forget(pg_database)
    assert store.text_search("u", "exchange", query, 10) == loaded  # what a search counts itself
