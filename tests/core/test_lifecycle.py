"""The canonical transcript: begin / complete / fail, persistence, times and metadata."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from arbormem import Memory, NotFoundError, StateError
from arbormem.embed.testing import HashEmbedder
from tests.conftest import chat


def test_begin_is_pending_and_never_recalled(mem: Memory) -> None:
    x = mem.begin("my cat is called Miso", user_id="u1", session_id="s", metadata={"k": 1})
    assert x.status == "pending" and x.seq == 1 and x.session_id == "s" and x.metadata == {"k": 1}
    assert x.topic_id is None
    r = mem.recall("what is my cat called?", user_id="u1", max_tokens=500, recent=3)
    assert "Miso" not in r.text and r.exchanges == ()
    assert mem.search("cat Miso", user_id="u1") == []


def test_complete_places_and_indexes(mem: Memory) -> None:
    x = mem.begin("my cat is called Miso", user_id="u1")
    done = mem.complete(x.id, "Miso is a lovely name for a cat.")
    assert done.status == "completed" and done.assistant_text.startswith("Miso")
    assert done.topic_id is not None and done.assistant_at is not None
    assert [m["role"] for m in done.messages] == ["user", "assistant"]
    assert mem.get(x.id) == done
    hits = mem.search("cat name Miso", user_id="u1")
    assert hits[0].exchange.id == x.id and hits[0].topic_id == done.topic_id
    r = mem.recall("what is my cat called?", user_id="u1", max_tokens=500)
    assert "my cat is called Miso" in r.text and r.exchanges[0].id == x.id


def test_fail_keeps_reason_and_hides_exchange(mem: Memory) -> None:
    x = mem.begin("tell me about volcanoes", user_id="u1")
    failed = mem.fail(x.id, "model timed out")
    assert failed.status == "failed" and failed.failure == "model timed out"
    with pytest.raises(StateError):
        mem.complete(x.id, "too late")
    with pytest.raises(StateError):
        mem.fail(x.id, "again")
    assert "volcanoes" not in mem.recall("volcanoes", user_id="u1", max_tokens=300, recent=5).text


def test_complete_twice_is_a_state_error(mem: Memory) -> None:
    x = mem.begin("hello there friend", user_id="u1")
    mem.complete(x.id, "hi")
    with pytest.raises(StateError):
        mem.complete(x.id, "hi again")


def test_unknown_ids(mem: Memory) -> None:
    for call in (lambda: mem.get("nope"), lambda: mem.complete("nope", "x"),
                 lambda: mem.fail("nope", "x"), lambda: mem.delete("nope")):
        with pytest.raises(NotFoundError):
            call()


def test_sequence_numbers_are_per_user(mem: Memory) -> None:
    a = [mem.add(chat(f"message {i} about apples", "ok"), user_id="alice").seq for i in range(3)]
    b = [mem.add(chat(f"message {i} about pears", "ok"), user_id="bob").seq for i in range(2)]
    assert a == [1, 2, 3] and b == [1, 2]


def test_supplied_times_and_metadata_round_trip(mem: Memory) -> None:
    past = datetime(2021, 5, 3, 14, 0, tzinfo=timezone.utc)
    ex = mem.add(chat("we adopted a dog named Rex", "congratulations"), user_id="u", at=past,
                 session_id="sess-9", metadata={"source": "import", "turns": ["D1:1", "D1:2"]})
    got = mem.get(ex.id)
    assert got.user_at == past and got.session_id == "sess-9"
    assert got.metadata == {"source": "import", "turns": ["D1:1", "D1:2"]}
    naive = mem.add(chat("naive time here", "ok"), user_id="u", at="2022-01-01T10:00:00")
    assert naive.user_at.tzinfo is not None


def test_system_and_tool_messages_are_kept_verbatim(mem: Memory) -> None:
    msgs = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "what's the weather in Oslo?"},
        {"role": "tool", "content": "Oslo: 3C, snow", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "Snowy, 3 degrees."},
    ]
    ex = mem.add(msgs, user_id="u")
    assert [dict(m) for m in mem.get(ex.id).messages] == msgs
    assert ex.user_text == "what's the weather in Oslo?" and ex.assistant_text == "Snowy, 3 degrees."


def test_persistence_across_reopen(db_path) -> None:
    with Memory(db_path, embedder=HashEmbedder()) as m1:
        ex = m1.add(chat("I keep bees on my balcony", "how many hives?"), user_id="u")
        pending = m1.begin("still waiting on this one", user_id="u")
        tree1 = m1.tree(user_id="u")
    with Memory(db_path, embedder=HashEmbedder()) as m2:
        assert m2.get(ex.id).user_text == "I keep bees on my balcony"
        assert m2.get(pending.id).status == "pending"
        assert m2.tree(user_id="u") == tree1
        assert "bees" in m2.recall("bees balcony", user_id="u", max_tokens=300).text
        done = m2.complete(pending.id, "done now")
        assert done.seq == 2
        assert m2.add(chat("next one", "ok"), user_id="u").seq == 3


def test_delete_removes_from_every_index(mem: Memory) -> None:
    keep = mem.add(chat("the wifi password is in the drawer", "ok"), user_id="u")
    gone = mem.add(chat("my bank pin is 4321 secret", "I won't repeat it"), user_id="u")
    mem.delete(gone.id)
    with pytest.raises(NotFoundError):
        mem.get(gone.id)
    assert all(h.exchange.id != gone.id for h in mem.search("bank pin secret", user_id="u"))
    assert "4321" not in mem.recall("bank pin", user_id="u", max_tokens=400, recent=5).text
    assert mem.get(keep.id).status == "completed"
    assert mem.tree(user_id="u").size == 1
    assert any(c.action == "delete" for c in mem.store.list_changes("u"))


def test_deleting_a_topics_first_and_last_exchange_moves_its_span(mem: Memory) -> None:
    from arbormem.check import check

    items = [{"messages": chat(f"the tomato seedlings need repotting, day {i}", "use deeper pots"),
              "session_id": "s"} for i in range(4)]
    xs = mem.add_many(items, user_id="u")
    topic = mem.get(xs[0].id).topic_id
    assert topic is not None and all(mem.get(x.id).topic_id == topic for x in xs)
    mem.delete(xs[0].id)
    mem.delete(xs[-1].id)
    t = mem.topic(topic, user_id="u")
    assert (t.start_seq, t.end_seq, t.size) == (xs[1].seq, xs[2].seq, 2)
    report = check(mem, user_id="u")
    assert report.ok, report.to_dict()


def test_delete_user_removes_everything_and_spares_others(mem: Memory, db_path) -> None:
    mem.add(chat("alice likes tea with honey", "noted"), user_id="alice")
    mem.add(chat("bob likes coffee black", "noted"), user_id="bob")
    assert mem.delete_user("alice") == 1
    assert mem.exchanges(user_id="alice") == [] and mem.topics(user_id="alice") == []
    assert mem.search("tea honey", user_id="alice") == []
    assert len(mem.exchanges(user_id="bob")) == 1
    mem.close()
    import sqlite3

    con = sqlite3.connect(db_path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for table in ("exchanges", "topics", "vectors", "changes", "term_df", "user_state"):
        assert con.execute(f"SELECT COUNT(*) FROM {table} WHERE user_id = 'alice'").fetchone()[0] == 0
    assert con.execute("SELECT COUNT(*) FROM exchange_fts WHERE body LIKE '%honey%'").fetchone()[0] == 0
    con.close()


def test_delete_rewrites_the_neighbours_lexical_keys(mem: Memory, db_path) -> None:
    a = mem.add(chat("planning the garden layout", "raised beds work well"), user_id="u", session_id="s")
    gone = mem.add(chat("my locker code is zebra-7731", "noted"), user_id="u", session_id="s")
    c = mem.add(chat("which tomatoes for the garden", "cherry tomatoes"), user_id="u", session_id="s")
    import sqlite3

    def bodies() -> str:
        con = sqlite3.connect(db_path)
        try:
            return "\n".join(r[0] for r in con.execute("SELECT body FROM exchange_fts"))
        finally:
            con.close()

    assert bodies().count("zebra-7731") == 3  # its own key and both neighbours' keys
    mem.delete(gone.id)
    assert "zebra" not in bodies()
    assert mem.search("raised beds tomatoes", user_id="u")[0].exchange.id in {a.id, c.id}
