"""Query analysis and the read path take any text (issue 19): Hypothesis property tests.

Questions such as "what did we say 5000 years ago" or "31 December 9999" raised OverflowError
from recall and search. Now ``analyse`` returns a window or none for any text against any
reference time ``datetime`` can hold, and recall/search answer any valid query on a memory
whose exchanges sit at both ends of the accepted time range."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arbormem import Memory, ValidationError
from arbormem.retrieve.query import analyse

from .conftest import open_memory, turn

PROPS = settings(max_examples=150, deadline=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Phrases the analyser reads, with numbers of every size, mixed with arbitrary text.
numbers = st.one_of(st.integers(min_value=0, max_value=40), st.integers(min_value=0, max_value=10**30)).map(str)
months = st.sampled_from(["january", "may", "december", "feb", "sept", "June"])
units = st.sampled_from(["day", "days", "week", "weeks", "month", "months", "year", "years"])
phrase = st.one_of(
    st.tuples(numbers, units).map(lambda t: f"{t[0]} {t[1]} ago"),
    st.tuples(numbers, months, numbers).map(lambda t: f"on {t[0]} {t[1]}, {t[2]}"),
    st.tuples(months, numbers, numbers).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
    st.tuples(st.sampled_from(["in", "of", "since"]), months, numbers).map(" ".join),
    st.sampled_from(["today", "yesterday", "last week", "last month", "last year", "last friday",
                     "a few weeks ago", "in 1999", "2023", "0001", "9999"]),
    st.text(max_size=8),
)
time_text = st.lists(phrase, max_size=4).map(" ".join)
any_text = st.one_of(time_text, st.text(max_size=200))
offsets = st.integers(min_value=-(24 * 60 - 1), max_value=24 * 60 - 1).map(
    lambda m: timezone(timedelta(minutes=m)))


@PROPS
@given(query=any_text, now=st.one_of(st.none(), st.datetimes(timezones=st.just(timezone.utc)),
                                     st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
                                                  timezones=offsets)))
def test_analyse_never_raises(query: str, now: datetime | None) -> None:
    q = analyse(query, now)
    if q.time_range is not None:
        assert q.time_range[0] <= q.time_range[1]


@pytest.fixture(scope="module")
def edge_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("edges") / "edges.db"
    with open_memory(db) as m:
        for i, at in enumerate(["0001-01-03T00:00:00+00:00", "2024-02-29T12:00:00+05:30",
                                "9999-12-29T23:59:59+00:00"]):
            m.add(turn(f"note {i} about the harbour and 2023 plans", f"reply {i} in December"),
                  user_id="early" if i == 0 else "late", at=at)
    return db


@PROPS
@given(query=any_text, user=st.sampled_from(["early", "late", "nobody"]))
def test_recall_and_search_take_any_query(edge_db: Path, query: str, user: str) -> None:
    with open_memory(edge_db) as m:
        try:
            r = m.recall(query, user_id=user, max_tokens=200)
        except ValidationError:  # empty, NUL, lone surrogate: refused the same way by both
            with pytest.raises(ValidationError):
                m.search(query, user_id=user)
            return
        assert r.tokens <= 200
        m.search(query, user_id=user, limit=5)


def test_property_memory_is_readable(edge_db: Path) -> None:
    with Memory(str(edge_db), embedder="hash") as m:
        assert m.recall("harbour", user_id="late").exchanges
