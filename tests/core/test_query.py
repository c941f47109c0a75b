"""Offline query analysis: terms, names and time windows resolved against the newest exchange."""

from __future__ import annotations

from datetime import date, datetime, timezone

import pytest

from arbormem.retrieve.query import analyse

NOW = datetime(2023, 12, 1, 15, 30, tzinfo=timezone.utc)  # a Friday


def window(query: str) -> tuple[date, date] | None:
    rng = analyse(query, NOW).time_range
    return (rng[0].date(), rng[1].date()) if rng else None


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        # a day and a month: the week up to that day (a mention "on" it, or "the weekend before")
        ("What did she start, as mentioned on 3 June, 2023?", (date(2023, 5, 27), date(2023, 6, 4))),
        ("What happened the weekend before April 10, 2023?", (date(2023, 4, 3), date(2023, 4, 11))),
        ("the 10th of May 2023", (date(2023, 5, 3), date(2023, 5, 11))),
        ("on December 25?", (date(2022, 12, 18), date(2022, 12, 26))),  # no year: the last one
        # months and years
        ("What did John volunteer for in August 2023?", (date(2023, 8, 1), date(2023, 9, 1))),
        ("the trip in May", (date(2023, 5, 1), date(2023, 6, 1))),
        ("our plans for 2022", (date(2022, 1, 1), date(2023, 1, 1))),
        ("February 30, 2023", (date(2023, 2, 1), date(2023, 3, 1))),  # no such day: the month
        # relative to the newest exchange
        ("what did I say yesterday", (date(2023, 11, 30), date(2023, 12, 1))),
        ("last Friday", (date(2023, 11, 24), date(2023, 11, 25))),
        ("two weeks ago", (date(2023, 11, 13), date(2023, 11, 21))),
    ],
)
def test_time_windows(query: str, expected: tuple[date, date]) -> None:
    assert window(query) == expected


def test_only_a_named_day_pins_the_window() -> None:
    # Recall lifts exchanges inside a named day's week by dated_boost, others by time_boost.
    assert analyse("What did she start, as mentioned on 3 June, 2023?", NOW).names_day
    assert analyse("February 30, 2023", NOW).time_range is not None
    for vague in ("February 30, 2023", "the trip in May", "last Friday", "our plans for 2022", "no date"):
        assert not analyse(vague, NOW).names_day


def test_may_the_verb_is_not_a_month_and_no_date_means_no_window() -> None:
    assert window("Who may join the club?") is None
    assert window("What does Melanie paint?") is None
    assert analyse("What did we decide in May?", None).time_range is None  # nothing to resolve against


def test_terms() -> None:
    q = analyse("What did Caroline research about adoption agencies?", NOW)
    assert "caroline" in q.terms  # a name is a term like any other (coverage counts it)
    assert "research" in q.terms and "adoption" in q.terms and "what" not in q.terms
