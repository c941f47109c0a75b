"""Bad input: a clear typed error and nothing stored half-way."""

from __future__ import annotations

import pytest

from arbormem import (
    ArbormemError,
    EmbeddingError,
    Memory,
    NotFoundError,
    StateError,
    ValidationError,
)
from arbormem.embed.testing import BrokenEmbedder
from tests.conftest import chat


@pytest.mark.parametrize("messages", [
    [],
    "just a string",
    [{"role": "wizard", "content": "hi"}],
    [{"role": "user", "content": "   "}],
    [{"role": "assistant", "content": "a reply without a question"}],
    [{"role": "user", "content": 42}],
    [{"content": "no role"}],
    ["not a dict"],
    [{"role": "user", "content": "bad\x00nul"}],
    [{"role": "user", "content": "lone surrogate \ud800"}],
    [{"role": "user", "name": 7, "content": "a number for a name"}],
    [{"role": "user", "name": "  ", "content": "a blank name"}],
    [{"role": "user", "name": "two\nlines", "content": "a name that starts a new line"}],
    [{"role": "user", "name": "x" * 65, "content": "a name too long"}],
])
def test_bad_messages_are_rejected(mem: Memory, messages) -> None:
    with pytest.raises(ValidationError):
        mem.add(messages, user_id="u")
    assert mem.exchanges(user_id="u") == []


@pytest.mark.parametrize("call", [
    lambda m: m.begin("", user_id="u"),
    lambda m: m.begin("hi", user_id=""),
    lambda m: m.begin("hi", user_id=7),
    lambda m: m.begin(None, user_id="u"),
    lambda m: m.begin("hi", user_id="u", at="yesterday-ish"),
    lambda m: m.begin("hi", user_id="u", metadata=["not", "a", "dict"]),
    lambda m: m.begin("hi", user_id="u", metadata={"x": object()}),
    lambda m: m.begin("x" * 300_000, user_id="u"),
    lambda m: m.recall("", user_id="u"),
    lambda m: m.recall("hi", user_id="u", max_tokens=-1),
    lambda m: m.recall("hi", user_id="u", max_tokens="10"),
    lambda m: m.search("hi", user_id="u", limit=0),
    lambda m: m.exchanges(user_id="u", status="weird"),
])
def test_bad_arguments(mem: Memory, call) -> None:
    with pytest.raises(ValidationError) as info:
        call(mem)
    assert isinstance(info.value, ArbormemError) and str(info.value)
    assert mem.exchanges(user_id="u") == []


def test_bulk_import_is_all_or_nothing(mem: Memory) -> None:
    items = [{"messages": chat(f"good item {i}", "ok")} for i in range(5)]
    items.insert(3, {"messages": [{"role": "user", "content": ""}]})
    with pytest.raises(ValidationError, match="item 3"):
        mem.add_many(items, user_id="u")
    assert mem.exchanges(user_id="u") == []
    with pytest.raises(ValidationError, match="unknown keys"):
        mem.add_many([{"messages": chat("a", "b"), "colour": "red"}], user_id="u")


def test_empty_reply_and_state_errors(mem: Memory) -> None:
    x = mem.begin("question", user_id="u")
    with pytest.raises(ValidationError):
        mem.complete(x.id, "  ")
    assert mem.get(x.id).status == "pending"
    mem.fail(x.id, "boom")
    with pytest.raises(StateError):
        mem.complete(x.id, "answer")
    with pytest.raises(NotFoundError):
        mem.topic("t_missing", user_id="u")


@pytest.mark.parametrize("mode", ["nan", "inf", "shape", "zero", "raise"])
def test_broken_embedder_never_writes(tmp_path, mode: str) -> None:
    with Memory(tmp_path / "m.db", embedder=BrokenEmbedder(mode)) as m:
        x = m.begin("remember this please", user_id="u")
        with pytest.raises(EmbeddingError):
            m.complete(x.id, "sure")
        assert m.get(x.id).status == "pending"  # still completable later
        with pytest.raises(EmbeddingError):
            m.add(chat("another", "one"), user_id="u")
        assert [e.id for e in m.exchanges(user_id="u")] == [x.id]
        assert m.store.list_topics("u") == []


def test_embedder_mismatch_is_refused(tmp_path) -> None:
    from arbormem import ConfigError
    from arbormem.embed.testing import HashEmbedder

    with Memory(tmp_path / "m.db", embedder=HashEmbedder(64)) as m:
        m.add(chat("hello there", "hi"), user_id="u")
    with Memory(tmp_path / "m.db", embedder=HashEmbedder(32)) as m:
        with pytest.raises(ConfigError):
            m.add(chat("hello again", "hi"), user_id="u")


def test_isolation_between_users(mem: Memory) -> None:
    a = mem.add(chat("alice's secret recipe uses saffron", "lovely"), user_id="alice")
    mem.add(chat("bob talks about saffron prices", "ok"), user_id="bob")
    assert all(h.exchange.user_id == "bob" for h in mem.search("saffron", user_id="bob"))
    r = mem.recall("saffron recipe", user_id="bob", max_tokens=500)
    assert "alice" not in r.text and all(e.user_id == "bob" for e in r.exchanges)
    with pytest.raises(NotFoundError):
        mem.topic(a.topic_id, user_id="bob")
