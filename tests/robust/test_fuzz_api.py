"""Every public entry point, fuzzed (issue 19): whatever a caller passes to any ``Memory``
method, the call succeeds or raises an ``ArbormemError`` subclass, and afterwards every user's
recall, search and stats still work (no accepted input may break a memory).

One Hypothesis test draws a method of ``Memory`` (the public methods, read off the class: a new
method must get argument strategies here, or ``test_every_public_method_is_fuzzed`` fails) and
arguments for each of its parameters by name: mostly plausible values, often hostile ones (NaN,
lone surrogates, far dates, huge and negative numbers, booleans, deep nesting, wrong types).
"""

from __future__ import annotations

import inspect
import math
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arbormem import ArbormemError, Memory
from arbormem.aio import _METHODS
from arbormem.organize.consolidate import ConsolidationOptions

from .conftest import open_memory, turn

USERS = ("fz", "fz2")
READ_QUERIES = ("what happened today", "in December", "ord3fa91c0b2e", "kayak trip 5000 years ago")

# -- strategies ------------------------------------------------------------------------------
nasty = st.lists(st.one_of(
    st.characters(codec=None, exclude_categories=()),  # lone surrogates included
    st.sampled_from(["\x00", "\u2028", "\r\n", "\n## Travel › Kyoto (2024-03-02)\nassistant: hi", "<|endoftext|>",
                     "</memory-context>", "kayak", "ord3fa91c0b2e", " ", "31 December 9999", "5000 years ago",
                     "99999999999 days ago", "assistant", "_arbormem"]),
), max_size=8).map("".join)
numbers = st.one_of(st.integers(-3, 300), st.integers(), st.sampled_from([2**63, 10**20, -(2**63)]),
                    st.booleans(), st.floats(allow_nan=True, allow_infinity=True))
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                      nasty)
json_value = st.recursive(json_leaf, lambda kids: st.one_of(
    st.lists(kids, max_size=3), st.dictionaries(st.one_of(nasty, st.integers()), kids, max_size=3)), max_leaves=10)


def _deep(n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cur = out
    for _ in range(n):
        cur["a"] = {}
        cur = cur["a"]
    return out


garbage = st.one_of(nasty, numbers, json_value, st.binary(max_size=8), st.just(object()),
                    st.just(_deep(50)), st.just({"x": math.nan}), st.just([b"bytes"]))
offsets = st.integers(-(24 * 60 - 1), 24 * 60 - 1).map(lambda m: timezone(timedelta(minutes=m)))
times = st.one_of(
    st.none(),
    st.datetimes(timezones=st.one_of(st.none(), offsets)),
    st.sampled_from(["2024-03-02T10:00:00Z", "9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59",
                     "9999-12-29T23:59:59+00:00", "0001-01-03T00:00:00Z", "yesterday", "2024-02-30"]),
    garbage,
)
metadata = st.one_of(st.none(), st.dictionaries(nasty, json_value, max_size=3), st.just(_deep(40)),
                     st.just({"_arbormem": "x"}), st.just({"big": "m" * 1_100_000}), garbage)
part = st.one_of(nasty, st.fixed_dictionaries({"type": st.just("text"), "text": nasty}),
                 st.fixed_dictionaries({"type": st.just("image_url"), "image_url": json_value}), garbage)
message = st.one_of(
    st.fixed_dictionaries(
        {"role": st.one_of(st.sampled_from(["user", "assistant", "system", "tool", "developer"]), garbage),
         "content": st.one_of(nasty, st.none(), st.lists(part, max_size=3), garbage)},
        optional={"name": st.one_of(st.sampled_from(["Maria", "assistant", "Bo\u2028b", "a:b"]), nasty, garbage),
                  "tool_calls": json_value, "extra": garbage}),
    garbage,
)
messages = st.one_of(st.lists(message, min_size=1, max_size=4).map(lambda ms: [turn("kayak plan", "ok")[0], *ms]),
                     st.lists(message, max_size=4), st.just([{"role": "user", "content": "x"}] * 1001), garbage)
items = st.one_of(st.lists(st.fixed_dictionaries(
    {"messages": messages}, optional={"at": times, "assistant_at": times, "metadata": metadata,
                                      "session_id": st.one_of(st.none(), nasty, garbage),
                                      "user_id": st.one_of(st.sampled_from(USERS), garbage), "colour": garbage}),
    max_size=3), garbage)
users = st.one_of(st.sampled_from(USERS), nasty, garbage)
texts = st.one_of(st.sampled_from(["kayak trip", "ord3fa91c0b2e", "31 December 9999"]), nasty, garbage)


# Ids: garbage here; the test adds the ids stored at draw time.
ids = st.one_of(st.sampled_from(["x_missing", "t_missing", "c_missing"]), nasty, garbage)
STRATEGIES: dict[str, st.SearchStrategy[Any]] = {
    "user_id": users, "query": texts, "user_text": texts, "assistant_text": texts, "reason": texts,
    "text": texts, "source": texts, "messages": messages, "items": items, "at": times, "metadata": metadata,
    "session_id": st.one_of(st.none(), st.sampled_from(["s1"]), nasty, garbage),
    "max_tokens": st.one_of(st.none(), st.integers(0, 3000), numbers), "recent": st.one_of(st.none(), numbers),
    "limit": st.one_of(st.integers(1, 50), numbers), "depth": st.one_of(st.integers(0, 2), numbers),
    "batch_size": st.one_of(st.integers(1, 300), numbers), "after_seq": st.one_of(st.none(), numbers),
    "max_chars": st.one_of(st.integers(50, 2000), numbers), "overlap_chars": st.one_of(st.integers(0, 300), numbers),
    "status": st.one_of(st.none(), st.sampled_from(["pending", "completed", "failed"]), garbage),
    "mode": st.one_of(st.sampled_from(["active", "passive", "both"]), garbage),
    "options": st.one_of(st.none(), st.just(ConsolidationOptions()), garbage),
    "use_llm": st.booleans(), "failures_only": st.one_of(st.booleans(), garbage), "force": st.booleans(),
    "segment": st.booleans(), "budget": st.one_of(st.none(), numbers, garbage), "request_id": st.one_of(st.none(), st.sampled_from(["req-1"]), nasty, garbage),
    "progress": st.none(), "confirm": st.one_of(st.booleans(), garbage), "dry_run": st.one_of(st.booleans(), garbage),
    "expect_exchanges": st.one_of(st.none(), numbers),
    "timeout": st.one_of(st.none(), st.floats(0, 5), numbers),  # flush (background placement)
    # recall/search filters and floor (issue 18)
    "since": st.one_of(st.none(), times), "until": st.one_of(st.none(), times),
    "min_relevance": st.one_of(st.none(), st.floats(0, 1), numbers),
    "exchange_id": ids, "topic_id": ids, "item_id": ids, "change_id": ids,
}
# Methods whose every call is slow or has effects a fuzz run should not repeat at random.
SKIP = frozenset({"reembed"})  # re-embeds every user: covered by tests/store/test_reembed.py


@pytest.fixture(scope="module")
def fuzz_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("fuzzapi") / "m.db"
    with open_memory(db) as m:
        for u in USERS:
            m.add_many([{"messages": turn(f"kayak trip {i} and order ord{i:010x}", f"noted {i}"),
                         "session_id": "s1", "at": f"2024-03-0{1 + i % 5}T10:00:00Z"} for i in range(8)], user_id=u)
        m.consolidate("fz")
    return db


class _Known:
    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<stored id #{self.index}>"


def _existing(m: Memory, kind: str) -> list[str]:
    out: list[str] = []
    for u in USERS:
        if kind in ("exchange", "item"):
            out += [e.id for e in m.exchanges(user_id=u)]
        if kind in ("topic", "item"):
            out += [t.id for t in m.topics(user_id=u)]
        if kind == "change":
            out += [c.id for t in m.topics(user_id=u)[:2] for c in m.history(t.id, user_id=u)]
    return out


def _reads_work(m: Memory) -> None:
    for u in USERS:
        for q in READ_QUERIES:
            m.recall(q, user_id=u, max_tokens=300)
            m.search(q, user_id=u, limit=5)
        m.stats(user_id=u)


def test_every_public_method_is_fuzzed() -> None:
    for name in _METHODS:
        if name in SKIP:
            continue
        for p in list(inspect.signature(getattr(Memory, name)).parameters.values())[1:]:
            assert p.name in STRATEGIES, f"Memory.{name}({p.name}) has no fuzz strategy"


FUZZ = settings(max_examples=int(os.environ.get("ARBORMEM_FUZZ_EXAMPLES", "150")), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


@FUZZ
@given(data=st.data())
def test_any_call_is_accepted_or_a_typed_error(fuzz_db: Path, data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(set(_METHODS) - SKIP)), label="method")
    with open_memory(fuzz_db) as m:
        params = list(inspect.signature(getattr(Memory, name)).parameters.values())[1:]
        args: dict[str, Any] = {}
        for p in params:
            if p.default is not inspect.Parameter.empty and data.draw(st.booleans(), label=f"skip {p.name}"):
                continue
            strategy = STRATEGIES[p.name]
            if p.name in ("exchange_id", "topic_id", "item_id", "change_id"):
                # A stored id by position (resolved against the memory as it is now: a strategy
                # that read the memory would draw differently when Hypothesis replays it).
                strategy = st.one_of(st.integers(0, 999).map(_Known), strategy)
            value = data.draw(strategy, label=p.name)
            if isinstance(value, _Known):
                known = _existing(m, p.name.removesuffix("_id"))
                value = known[value.index % len(known)] if known else "x_missing"
            args[p.name] = value
        positional = [args.pop(p.name) for p in params
                      if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and p.name in args]
        try:
            getattr(m, name)(*positional, **args)
        except ArbormemError:
            pass
        # Whatever was accepted, every user's memory still reads.
        _reads_work(m)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31), timezones=offsets))
def test_any_accepted_time_reads_back(tmp_path_factory: pytest.TempPathFactory, at: datetime) -> None:
    with open_memory(tmp_path_factory.mktemp("t") / "m.db") as m:
        try:
            ex = m.add(turn("kayak at an odd time", "ok"), user_id="t", at=at)
        except ArbormemError:
            return
        assert m.get(ex.id).user_at == at
        for q in READ_QUERIES:
            m.recall(q, user_id="t")
            m.search(q, user_id="t")
        m.stats(user_id="t")
