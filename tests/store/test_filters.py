"""Filters of recall and search (issue 18) inside the store queries, on SQLite and PostgreSQL.

Each index search ranks within the exchanges the filter admits (not an unfiltered top-k with
rows dropped): with k=1 the best admitted exchange comes back even when better ones exist.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from arbormem.store.base import ExchangeFilter, Store

from .test_contract import T0, ex, unit

# Four exchanges: session, hour after T0, metadata.
ROWS = [
    ("s1", 0, {"channel": "web", "n": 1, "ok": True}),
    ("s1", 1, {"channel": "mail", "n": 2.0, "ok": False}),
    ("s2", 2, {"channel": "web", "n": 2, "ok": None}),
    ("s2", 3, {"channel": "web", "n": "2", "tags": ["a"]}),
]


@pytest.fixture
def filled(store: Store) -> Store:
    vecs = []
    for seq, (sid, hours, meta) in enumerate(ROWS, start=1):
        e = dataclasses.replace(ex("u", seq, f"boiler note {seq}"), session_id=sid, metadata=meta,
                                user_at=T0 + timedelta(hours=hours))
        store.insert_exchange(e)
        store.put_text("u", "exchange", e.id, e.user_text)
        vecs.append(unit(1.0, 0.1 * seq, 0.0))
    store.put_vectors("u", "exchange", [f"e_u_{s}" for s in range(1, 5)], np.stack(vecs))
    # another user with the same session id and text: never returned
    other = dataclasses.replace(ex("v", 1, "boiler note"), session_id="s1")
    store.insert_exchange(other)
    store.put_text("v", "exchange", other.id, other.user_text)
    store.put_vectors("v", "exchange", [other.id], np.stack([unit(1.0, 0.0, 0.0)]))
    return store


CASES = [
    (ExchangeFilter(session_id="s2"), {3, 4}),
    (ExchangeFilter(since=T0 + timedelta(hours=1)), {2, 3, 4}),
    (ExchangeFilter(until=T0 + timedelta(hours=1)), {1}),
    # the same instant in another offset
    (ExchangeFilter(since=(T0 + timedelta(hours=1)).astimezone(timezone(timedelta(hours=-5))),
                    until=T0 + timedelta(hours=3)), {2, 3}),
    (ExchangeFilter(metadata={"channel": "web"}), {1, 3, 4}),
    (ExchangeFilter(metadata={"n": 2}), {2, 3}),          # 2 == 2.0; "2" is text
    (ExchangeFilter(metadata={"n": "2"}), {4}),
    (ExchangeFilter(metadata={"ok": True}), {1}),         # true is not 1
    (ExchangeFilter(metadata={"n": True}), set()),
    (ExchangeFilter(metadata={"ok": None}), {3}),         # null, not a missing key
    (ExchangeFilter(metadata={"channel": "web", "n": 2}, session_id="s2"), {3}),
    (ExchangeFilter(session_id="nope"), set()),           # a filter that matches nothing
    (ExchangeFilter(metadata={"missing": "x"}), set()),
]


@pytest.mark.parametrize(("where", "seqs"), CASES)
def test_every_index_applies_the_filter(filled: Store, where: ExchangeFilter, seqs: set[int]) -> None:
    q = unit(1.0, 0.0, 0.0)
    want = {f"e_u_{s}" for s in seqs}
    assert {i for i, _ in filled.vector_search("u", "exchange", q, 10, where)} == want
    assert {i for i, _ in filled.text_search("u", "exchange", ["boiler"], 10, where)} == want
    assert {e.id for e in filled.list_exchanges("u", where=where)} == want
    assert {e.id for e in filled.exchanges_by_seq("u", [1, 2, 3, 4], where)} == want
    assert all(where.matches(e) == (e.id in want) for e in filled.list_exchanges("u"))


def test_filtered_top_k_ranks_inside_the_filter(filled: Store) -> None:
    # exchange 1 is the closest to q overall; within session s2 the best is exchange 3
    q = unit(1.0, 0.0, 0.0)
    assert filled.vector_search("u", "exchange", q, 1)[0][0] == "e_u_1"
    assert filled.vector_search("u", "exchange", q, 1, ExchangeFilter(session_id="s2"))[0][0] == "e_u_3"
    assert len(filled.text_search("u", "exchange", ["boiler"], 1, ExchangeFilter(session_id="s2"))) == 1


def test_empty_filter_is_no_filter(filled: Store) -> None:
    assert not ExchangeFilter()
    q = unit(1.0, 0.0, 0.0)
    assert filled.vector_search("u", "exchange", q, 10, ExchangeFilter()) == filled.vector_search(
        "u", "exchange", q, 10)


def test_filter_leaves_topics_alone(store: Store) -> None:
    store.put_vectors("u", "topic", ["t"], np.stack([unit(1, 0, 0)]))
    assert store.vector_search("u", "topic", unit(1, 0, 0), 5, ExchangeFilter(session_id="x")) == [
        ("t", pytest.approx(1.0, abs=1e-5))]


def test_datetime_bounds_are_half_open(filled: Store) -> None:
    at = T0 + timedelta(hours=2)
    assert {e.seq for e in filled.list_exchanges("u", where=ExchangeFilter(since=at, until=at + timedelta(
        microseconds=1)))} == {3}
    assert {e.seq for e in filled.list_exchanges("u", where=ExchangeFilter(until=at))} == {1, 2}
    assert datetime(2026, 3, 1, tzinfo=timezone.utc) < T0
