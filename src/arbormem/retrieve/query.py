"""Query analysis without an LLM: content terms, names, and time expressions.

Time expressions are resolved against a reference time (the newest exchange of the user, or
the caller's "now"): month names with or without a year ("in May", "May 2023"), years,
"yesterday", "last week/month/year", "N days/weeks/months/years ago", weekdays ("last
Friday"). The result is a time window that the scorer uses as a soft boost, never a hard
filter (a wrong parse must not hide the answer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..text import terms

MONTHS = {m: i + 1 for i, m in enumerate(
    "january february march april may june july august september october november december".split()
)}
MONTHS.update({m[:3]: i for m, i in list(MONTHS.items())})
MONTHS["sept"] = 9
WEEKDAYS = {d: i for i, d in enumerate("monday tuesday wednesday thursday friday saturday sunday".split())}
_UNITS = {"day": 1, "week": 7, "month": 30, "year": 365}
_NUM_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
              "seven": 7, "eight": 8, "nine": 9, "ten": 10, "few": 3, "couple": 2, "several": 3}


@dataclass(frozen=True)
class QueryAnalysis:
    """What recall needs to know about a query."""

    text: str
    terms: tuple[str, ...]
    time_range: tuple[datetime, datetime] | None = None
    names_day: bool = False  # the window is the week up to a day the query names
    notes: tuple[str, ...] = field(default_factory=tuple)


def _month_range(year: int, month: int, tz) -> tuple[datetime, datetime]:  # type: ignore[no-untyped-def]
    start = datetime(year, month, 1, tzinfo=tz)
    end = datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=tz)
    return start, end


def analyse(query: str, now: datetime | None) -> QueryAnalysis:
    """Content terms and a time window for ``query`` (relative to ``now``). Never raises: a
    date that ``datetime`` cannot hold ("5000 years ago", "31 December 9999", a window
    reaching past year 9999) gives no window, and the query is ranked without one."""
    low = query.lower()
    rng: tuple[datetime, datetime] | None = None
    notes: list[str] = []
    day = None
    if now is not None:
        try:
            rng, day, notes = _window(low, now)
        except (OverflowError, ValueError, ArithmeticError):
            rng, day, notes = None, None, []
    return QueryAnalysis(text=query, terms=tuple(terms(query)), time_range=rng,
                         names_day=day is not None, notes=tuple(notes))


def _window(low: str, now: datetime) -> tuple[tuple[datetime, datetime] | None, tuple[int, int, int] | None,
                                               list[str]]:
    """The time window of a lower-cased query, the day it names (if any) and trace notes;
    raises OverflowError/ValueError when a date falls outside what ``datetime`` holds."""
    words = re.findall(r"[\w']+", low)
    rng: tuple[datetime, datetime] | None = None
    notes: list[str] = []
    tz = now.tzinfo
    day0 = now.replace(hour=0, minute=0, second=0, microsecond=0)
    year_m = re.search(r"\b(19|20)(\d\d)\b", low)
    year = int(year_m.group(0)) if year_m else None
    day = _full_date(low, year, now)
    if day is not None:
        # A dated mention ("as mentioned on 3 June, 2023", "the weekend before April 10,
        # 2023") is about that day or the days just before it: a week up to the day.
        d = datetime(day[0], day[1], day[2], tzinfo=tz)
        rng = (d - timedelta(days=7), d + timedelta(days=1))
        notes.append(f"day {d.date().isoformat()}")
    for i, w in enumerate(words):
        if rng is not None:
            break
        if w in MONTHS and not (w == "may" and not _may_is_month(words, i)):
            month = MONTHS[w]
            y = year or (now.year if month <= now.month else now.year - 1)
            rng = _month_range(y, month, tz)
            notes.append(f"month {y}-{month:02d}")
            break
    if rng is None and year is not None:
        rng = (datetime(year, 1, 1, tzinfo=tz), datetime(year + 1, 1, 1, tzinfo=tz))
        notes.append(f"year {year}")
    if rng is None:
        if "yesterday" in words:
            rng = (day0 - timedelta(days=1), day0)
        elif "today" in words:
            rng = (day0, day0 + timedelta(days=1))
        m = re.search(r"\blast (week|month|year)\b", low)
        if m:
            span = _UNITS[m.group(1)]
            rng = (day0 - timedelta(days=2 * span), day0)
        m = re.search(r"\b(\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten|few|couple|several)"
                      r"(?: of)? (day|week|month|year)s? ago\b", low)
        if m:
            n = int(m.group(1)) if m.group(1).isdigit() else _NUM_WORDS[m.group(1)]
            center = day0 - timedelta(days=n * _UNITS[m.group(2)])
            half = timedelta(days=max(1, _UNITS[m.group(2)] * n // 3))
            rng = (center - half, center + half)
        m = re.search(r"\blast (monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b", low)
        if m:
            back = (day0.weekday() - WEEKDAYS[m.group(1)]) % 7 or 7
            d = day0 - timedelta(days=back)
            rng = (d, d + timedelta(days=1))
        if rng is not None:
            notes.append("relative time")
    return rng, day, notes


_MONTH_RE = "|".join(sorted(MONTHS, key=len, reverse=True))
_DAY_MONTH = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?(?: of)? ({_MONTH_RE})\b\.?,?(?: (\d{{4}}))?")
_MONTH_DAY = re.compile(rf"\b({_MONTH_RE})\.? (\d{{1,2}})(?:st|nd|rd|th)?\b,?(?: (\d{{4}}))?")


def _full_date(low: str, year: int | None, now: datetime) -> tuple[int, int, int] | None:
    """(year, month, day) of a date written with a day and a month ("3 June, 2023", "April
    10", "10th of May 2023"); without a year, the last such day up to ``now``."""
    for m in (_DAY_MONTH.search(low), _MONTH_DAY.search(low)):
        if m is None:
            continue
        if m.re is _DAY_MONTH:
            d, mon, y = m.group(1), m.group(2), m.group(3)
        else:
            mon, d, y = m.group(1), m.group(2), m.group(3)
        yy = int(y) if y else year
        if yy is None:
            yy = now.year if (MONTHS[mon], int(d)) <= (now.month, now.day) else now.year - 1
        try:
            datetime(yy, MONTHS[mon], int(d))
        except ValueError:
            continue
        return yy, MONTHS[mon], int(d)
    return None


def _may_is_month(words: list[str], i: int) -> bool:
    """'may' is a month next to a number/year or after 'in'/'of'/'since', not the modal verb."""
    prev = words[i - 1] if i > 0 else ""
    nxt = words[i + 1] if i + 1 < len(words) else ""
    return prev in {"in", "of", "since", "early", "late", "mid", "last", "this", "during", "until"} or nxt.isdigit() or prev.isdigit()
