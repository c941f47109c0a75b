"""One contract suite for every ``Store``: each test runs on SQLite and on PostgreSQL.

A behaviour belongs here when the memory above the store relies on it; a backend that
differs from the other is a bug in one of them.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from arbormem.errors import StoreError
from arbormem.models import Exchange
from arbormem.store.base import Store, TopicRecord
from arbormem.store.state import TopicMeta
from arbormem.text import token_record

T0 = datetime(2026, 3, 1, 9, 30, 15, 123456, tzinfo=timezone.utc)


def ex(user: str, seq: int, text: str = "hello", *, status: str = "completed",
       topic: str | None = None, ex_id: str | None = None) -> Exchange:
    return Exchange(
        id=ex_id or f"e_{user}_{seq}",
        user_id=user,
        session_id="s1",
        seq=seq,
        status=status,  # type: ignore[arg-type]
        messages=(
            {"role": "user", "content": text, "name": "ünï"},
            {"role": "assistant", "content": f"re: {text}", "z": [1, {"b": None}], "a": 1.5},
        ),
        user_text=text,
        assistant_text=f"re: {text}",
        user_at=T0 + timedelta(minutes=seq),
        assistant_at=T0 + timedelta(minutes=seq, seconds=3) if status == "completed" else None,
        metadata={"channel": "web", "tags": ["a", "b"], "nested": {"k": 1}},
        topic_id=topic,
    )


def topic(user: str, tid: str, parent: str | None = None, **kw: object) -> TopicRecord:
    rec = TopicRecord(id=tid, user_id=user, kind="topic" if parent else "theme", parent_id=parent)
    for k, v in kw.items():
        setattr(rec, k, v)
    return rec


def unit(*xs: float) -> np.ndarray:
    v = np.asarray(xs, dtype=np.float32)
    return (v / np.linalg.norm(v)).astype(np.float32)


# -- lifecycle -----------------------------------------------------------------------------------
def test_meta_roundtrip_and_overwrite(store: Store) -> None:
    assert store.get_meta("embedder") is None
    store.set_meta("embedder", "hash:64")
    store.set_meta("embedder", "local:384")
    assert store.get_meta("embedder") == "local:384"


def test_data_persists_across_reopen(store_factory: Callable[[], Store]) -> None:
    first = store_factory()
    with first.transaction("u1"):
        first.insert_exchange(ex("u1", first.next_seq("u1")))
    first.set_meta("k", "v")
    first.close()
    second = store_factory()
    assert second.get_meta("k") == "v"
    assert [e.seq for e in second.list_exchanges("u1")] == [1]
    assert second.next_seq("u1") == 2


# -- sequence numbers ----------------------------------------------------------------------------
def test_next_seq_counts_per_user(store: Store) -> None:
    assert [store.next_seq("a") for _ in range(3)] == [1, 2, 3]
    assert store.next_seq("b") == 1
    assert store.next_seq("a") == 4


def test_next_seq_is_unique_under_threads(store_factory: Callable[[], Store]) -> None:
    stores = [store_factory(), store_factory()]  # two instances = two independent clients
    got: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def writer(s: Store, n: int) -> None:
        try:
            for _ in range(n):
                with s.transaction("u"):
                    seq = s.next_seq("u")
                    s.insert_exchange(ex("u", seq))
                with lock:
                    got.append(seq)
        except BaseException as exc:  # noqa: BLE001 - reported by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(stores[i % 2], 15)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(got) == list(range(1, 61))
    assert [e.seq for e in stores[0].list_exchanges("u")] == list(range(1, 61))


def test_insert_raises_counter_past_imported_seq(store: Store) -> None:
    # An imported or migrated memory must continue after its highest sequence number.
    store.insert_exchange(ex("u", 41))
    assert store.next_seq("u") == 42
    store.insert_exchange(ex("u", 7, ex_id="late"))  # a lower seq never lowers the counter
    assert store.next_seq("u") == 43


# -- exchanges -----------------------------------------------------------------------------------
def test_exchange_roundtrip_is_exact(store: Store) -> None:
    e = ex("u", 1, "Grüße aus Köln — 東京 🎉")
    store.insert_exchange(e)
    got = store.get_exchange(e.id)
    assert got == e
    assert got is not None and got.messages[1]["z"] == [1, {"b": None}]
    assert store.get_exchange("missing") is None


def test_update_exchange_overwrites_mutable_fields(store: Store) -> None:
    e = ex("u", 1, status="pending")
    store.insert_exchange(e)
    done = Exchange(**{**e.__dict__, "status": "completed", "assistant_text": "done",
                       "assistant_at": T0 + timedelta(hours=1), "topic_id": "t1",
                       "failure": None, "archived": True, "metadata": {"x": 2}})
    store.update_exchange(done)
    assert store.get_exchange(e.id) == done


def test_get_and_list_exchanges_filters(store: Store) -> None:
    for seq in range(1, 8):
        store.insert_exchange(ex("u", seq, status="pending" if seq % 3 == 0 else "completed",
                                 topic="t1" if seq <= 4 else "t2"))
    store.insert_exchange(ex("other", 1))
    got = store.get_exchanges("u", ["e_u_5", "e_u_2", "nope", "e_other_1", "e_u_5"])
    assert [e.seq for e in got] == [2, 5]
    assert [e.seq for e in store.list_exchanges("u")] == list(range(1, 8))
    assert [e.seq for e in store.list_exchanges("u", status="pending")] == [3, 6]
    assert [e.seq for e in store.list_exchanges("u", topic_id="t2")] == [5, 6, 7]
    assert [e.seq for e in store.list_exchanges("u", after_seq=5)] == [6, 7]
    assert [e.seq for e in store.list_exchanges("u", limit=2, newest_first=True)] == [7, 6]
    assert [e.seq for e in store.iter_exchanges("u", batch=3)] == list(range(1, 8))
    assert [e.seq for e in store.exchanges_by_seq("u", [6, 2, 99, 2])] == [2, 6]
    assert store.exchanges_by_seq("u", []) == [] and store.exchanges_by_seq("nobody", [1]) == []
    assert store.count_exchanges("u") == {"pending": 2, "completed": 5, "failed": 0}
    assert store.count_exchanges(None) == {"pending": 2, "completed": 6, "failed": 0}
    assert store.list_users() == ["other", "u"]


def test_exchange_texts_only_the_users_own(store: Store) -> None:
    store.insert_exchange(ex("u", 1, "first"))
    store.insert_exchange(ex("u", 2, "second", status="pending"))
    store.insert_exchange(ex("other", 1, "theirs"))
    got = store.exchange_texts("u", ["e_u_2", "nope", "e_other_1", "e_u_1", "e_u_2"])
    assert {i: (t.user, t.assistant) for i, t in got.items()} == {
        "e_u_1": ("first", "re: first"), "e_u_2": ("second", "re: second")}
    assert store.exchange_texts("u", []) == {}
    # The tokens recall reads are kept with the texts, and follow an update of them.
    assert got["e_u_1"].tokens == token_record("first", "re: first")
    store.update_exchange(dataclasses.replace(ex("u", 1, "first"), assistant_text="an edited reply"))
    assert store.exchange_texts("u", ["e_u_1"])["e_u_1"].tokens == token_record("first", "an edited reply")


def test_exchange_heads_follow_every_write(store_factory: Callable[[], Store]) -> None:
    """Heads may be kept between reads (SQLite): a write through this store or another one
    on the same database shows in the next read."""
    a, b = store_factory(), store_factory()
    a.insert_exchange(ex("u", 1, topic="t1"))
    a.insert_exchange(ex("u", 2, topic="t1"))
    assert sorted((h.id, h.topic_id) for h in a.exchange_heads("u", ["e_u_2", "e_u_1", "e_u_2"])) == [
        ("e_u_1", "t1"), ("e_u_2", "t1")]
    e1 = a.get_exchange("e_u_1")
    assert e1 is not None
    a.update_exchange(Exchange(**{**e1.__dict__, "topic_id": "t2"}))
    assert [h.topic_id for h in a.exchange_heads("u", ["e_u_1"])] == ["t2"]
    assert [h.topic_id for h in b.exchange_heads("u", ["e_u_1"])] == ["t2"]
    b.update_exchange(Exchange(**{**e1.__dict__, "topic_id": "t3", "archived": True}))
    assert [(h.topic_id, h.archived) for h in a.exchange_heads("u", ["e_u_1"])] == [("t3", True)]
    b.delete_exchange("e_u_2")
    assert [h.id for h in a.exchange_heads("u", ["e_u_1", "e_u_2"])] == ["e_u_1"]
    assert a.exchange_heads("other", ["e_u_1"]) == []


def test_topic_heads_follow_every_write(store_factory: Callable[[], Store]) -> None:
    """Topic heads may be kept between reads (SQLite): a write through this store or another
    one on the same database shows in the next read."""
    a, b = store_factory(), store_factory()
    a.put_topic(topic("u", "th", title="Garden"))
    a.put_topic(topic("u", "t1", "th", title="Tomatoes"))
    assert {i: (t.title, t.parent_id) for i, t in a.topic_heads("u", ["t1", "th", "t1", "nope"]).items()} == {
        "t1": ("Tomatoes", "th"), "th": ("Garden", None)}
    a.put_topic(topic("u", "t1", "th", title="Tomato blight"))
    assert a.topic_heads("u", ["t1"])["t1"].title == "Tomato blight"
    assert b.topic_heads("u", ["t1"])["t1"].title == "Tomato blight"
    b.put_topic(topic("u", "t1", None, title="Blight"))
    assert a.topic_heads("u", ["t1"])["t1"].parent_id is None
    b.delete_topic("t1")
    assert a.topic_heads("u", ["t1", "th"]).keys() == {"th"}
    assert a.topic_heads("other", ["th"]) == {}


def test_delete_exchange_removes_row_and_index_entries(store: Store) -> None:
    store.insert_exchange(ex("u", 1, "zebra crossing"))
    store.insert_exchange(ex("u", 2, "zebra stripes"))
    store.put_vectors("u", "exchange", ["e_u_1", "e_u_2"], np.stack([unit(1, 0), unit(0, 1)]))
    store.put_text("u", "exchange", "e_u_1", "zebra crossing")
    store.put_text("u", "exchange", "e_u_2", "zebra stripes")
    store.delete_exchange("e_u_1")
    assert store.get_exchange("e_u_1") is None
    assert [i for i, _ in store.vector_search("u", "exchange", unit(1, 0), 5)] == ["e_u_2"]
    assert [i for i, _ in store.text_search("u", "exchange", ["zebra"], 5)] == ["e_u_2"]
    assert store.get_vectors("u", "exchange", ["e_u_1"]) == {}


# -- topics --------------------------------------------------------------------------------------
def test_topic_roundtrip_and_upsert(store: Store) -> None:
    rec = topic("u", "t1", None, title="Travel", keywords=["japan", "rail"], summary="trips",
                start_seq=1, end_seq=4, size=4, first_at=T0, last_at=T0 + timedelta(days=1),
                frozen=True, vec_sum=np.array([0.5, -1.25, 3.0], dtype=np.float32),
                terms={"japan": 3, "rail": 1}, created_seq=1, meta=TopicMeta(links=["t2"], extra={"v": [1, 2]}))
    store.put_topic(rec)
    got = store.get_topic("t1")
    assert got is not None
    assert got.vec_sum is not None and got.vec_sum.dtype == np.float32
    assert np.array_equal(got.vec_sum, rec.vec_sum)
    assert (got.title, got.keywords, got.terms, got.meta) == (rec.title, rec.keywords, rec.terms, rec.meta)
    assert (got.first_at, got.last_at, got.frozen, got.size) == (T0, rec.last_at, True, 4)
    rec.title, rec.vec_sum, rec.size = "Trips", None, 5
    store.put_topic(rec)
    again = store.get_topic("t1")
    assert again is not None and (again.title, again.vec_sum, again.size) == ("Trips", None, 5)
    assert store.get_topic("nope") is None


def test_get_topics_in_one_call_only_the_users_own(store: Store) -> None:
    for uid, tid in (("u", "a"), ("u", "b"), ("v", "c")):
        store.put_topic(topic(uid, tid, None, title=tid.upper()))
    got = store.get_topics("u", ["a", "b", "c", "missing", "a"])
    assert sorted(got) == ["a", "b"] and got["b"].title == "B"  # "c" is another user's
    assert store.get_topics("u", []) == {}
    many = [f"t{i}" for i in range(1200)]  # more ids than SQLite binds in one statement
    for tid in many:
        store.put_topic(topic("u", tid, "a"))
    assert len(store.get_topics("u", many)) == 1200


def test_list_topics_by_parent_in_insertion_order(store: Store) -> None:
    store.put_topic(topic("u", "th1"))
    store.put_topic(topic("u", "c2", "th1"))
    store.put_topic(topic("u", "c1", "th1"))
    store.put_topic(topic("u", "th0"))
    store.put_topic(topic("v", "other"))
    store.put_topic(topic("u", "c2", "th1", title="renamed"))  # upsert keeps its place
    assert [t.id for t in store.list_topics("u")] == ["th1", "c2", "c1", "th0"]
    assert [t.id for t in store.list_topics("u", None)] == ["th1", "th0"]
    assert [t.id for t in store.list_topics("u", "th1")] == ["c2", "c1"]
    store.delete_topic("c1")
    assert [t.id for t in store.list_topics("u", "th1")] == ["c2"]


# -- vectors -------------------------------------------------------------------------------------
def test_vectors_roundtrip_exact_and_search_by_cosine(store: Store) -> None:
    rng = np.random.default_rng(7)
    mat = rng.normal(size=(40, 16)).astype(np.float32)
    mat /= np.linalg.norm(mat, axis=1, keepdims=True)
    ids = [f"x{i}" for i in range(40)]
    store.put_vectors("u", "exchange", ids, mat)
    got = store.get_vectors("u", "exchange", ["x3", "x39", "nope"])
    assert set(got) == {"x3", "x39"}
    assert np.array_equal(got["x3"], mat[3]) and got["x3"].dtype == np.float32
    q = mat[5]
    hits = store.vector_search("u", "exchange", q, 5)
    expect = np.argsort(-(mat @ q))[:5]
    assert [h[0] for h in hits] == [ids[i] for i in expect]
    assert hits[0][1] == pytest.approx(1.0, abs=1e-5)
    assert [s for _, s in hits] == pytest.approx([float(mat[i] @ q) for i in expect], abs=1e-5)
    assert len(store.vector_search("u", "exchange", q, 100)) == 40
    assert store.vector_search("u", "exchange", q, 0) == []


def test_vectors_upsert_and_partitioning(store: Store) -> None:
    store.put_vectors("u", "exchange", ["a", "b"], np.stack([unit(1, 0, 0), unit(0, 1, 0)]))
    store.put_vectors("u", "exchange", ["a"], np.stack([unit(0, 0, 1)]))
    store.put_vectors("u", "topic", ["t"], np.stack([unit(1, 0, 0)]))
    store.put_vectors("v", "exchange", ["c"], np.stack([unit(1, 0, 0)]))
    assert [i for i, _ in store.vector_search("u", "exchange", unit(0, 0, 1), 1)] == ["a"]
    assert [i for i, _ in store.vector_search("u", "exchange", unit(1, 0, 0), 3)][0] != "c"
    assert {i for i, _ in store.vector_search("u", "exchange", unit(1, 0, 0), 10)} == {"a", "b"}
    assert [i for i, _ in store.vector_search("u", "topic", unit(1, 0, 0), 10)] == ["t"]
    assert [i for i, _ in store.vector_search("v", "exchange", unit(0, 1, 0), 10)] == ["c"]
    assert store.get_vectors("v", "exchange", ["a", "b"]) == {}
    assert store.vector_search("nobody", "exchange", unit(1, 0, 0), 10) == []


def test_search_stays_exact_through_rewrites_appends_and_deletes(store: Store) -> None:
    # SQLite searches a transposed copy of its cached matrix (store/sqlite.py, _exact_scores)
    # that follows rows rewritten in place, appended rows and deletions.
    rng = np.random.default_rng(11)

    def units(n: int) -> np.ndarray:
        m = rng.normal(size=(n, 16)).astype(np.float32)
        return m / np.linalg.norm(m, axis=1, keepdims=True)

    vecs = dict(zip([f"x{i}" for i in range(50)], units(50), strict=True))
    store.put_vectors("u", "exchange", list(vecs), np.stack(list(vecs.values())))

    def check() -> None:
        ids = list(vecs)
        mat = np.stack([vecs[i] for i in ids])
        for q in units(4):
            hits = store.vector_search("u", "exchange", q, 7)
            expect = np.argsort(-(mat @ q))[:7]
            assert [h[0] for h in hits] == [ids[i] for i in expect]
            assert [s for _, s in hits] == pytest.approx([float(mat[i] @ q) for i in expect], abs=1e-5)

    check()
    vecs.update(zip(["x3", "x40"], units(2), strict=True))  # rewritten in place
    store.put_vectors("u", "exchange", ["x3", "x40"], np.stack([vecs["x3"], vecs["x40"]]))
    check()
    more = dict(zip([f"y{i}" for i in range(200)], units(200), strict=True))  # past the copy's room
    store.put_vectors("u", "exchange", list(more), np.stack(list(more.values())))
    vecs.update(more)
    check()
    store.delete_index("exchange", "x7")
    store.delete_index("exchange", "y5")
    del vecs["x7"], vecs["y5"]
    check()


def test_delete_index_drops_a_searched_vector(store: Store) -> None:
    store.put_vectors("u", "exchange", ["a", "b"], np.stack([unit(1, 0, 0), unit(0, 1, 0)]))
    assert len(store.vector_search("u", "exchange", unit(1, 0, 0), 10)) == 2  # now cached
    store.delete_index("exchange", "b")
    assert store.get_vectors("u", "exchange", ["b"]) == {}
    assert {i for i, _ in store.vector_search("u", "exchange", unit(1, 0, 0), 10)} == {"a"}


# -- full text -----------------------------------------------------------------------------------
def test_text_search_ranks_by_bm25(store: Store) -> None:
    docs = {
        1: "the ferry to the island leaves at noon",
        2: "ferry ferry ferry schedule for the harbour ferry",
        3: "we talked about pottery and glazing",
        4: "the island has a pottery studio",
    }
    for seq, body in docs.items():
        store.insert_exchange(ex("u", seq, body))
        store.put_text("u", "exchange", f"e_u_{seq}", body)
    hits = store.text_search("u", "exchange", ["ferry"], 10)
    assert [h[0] for h in hits] == ["e_u_2", "e_u_1"]
    assert hits[0][1] > hits[1][1] > 0
    # any of the terms matches; matching both rare terms ranks first
    both = store.text_search("u", "exchange", ["pottery", "island"], 10)
    assert both[0][0] == "e_u_4"
    assert {h[0] for h in both} == {"e_u_1", "e_u_3", "e_u_4"}
    assert len(store.text_search("u", "exchange", ["pottery", "island"], 2)) == 2
    assert store.text_search("u", "exchange", [], 10) == []
    assert store.text_search("u", "exchange", ["absent"], 10) == []


def test_text_search_is_case_and_accent_insensitive(store: Store) -> None:
    store.insert_exchange(ex("u", 1, "Café Müller in ZÜRICH"))
    store.put_text("u", "exchange", "e_u_1", "Café Müller in ZÜRICH")
    for term in ("cafe", "café", "muller", "zürich", "zurich"):
        assert [h[0] for h in store.text_search("u", "exchange", [term], 5)] == ["e_u_1"], term


def test_text_search_matches_word_forms(store: Store) -> None:
    # Porter stemming on both stores: the question says "research", the turn "Researching".
    store.insert_exchange(ex("u", 1, "Researching adoption agencies"))
    store.put_text("u", "exchange", "e_u_1", "Researching adoption agencies")
    store.insert_exchange(ex("u", 2, "we went camping twice"))
    store.put_text("u", "exchange", "e_u_2", "we went camping twice")
    for term in ("research", "researched", "agency", "camp", "camps"):
        assert [h[0] for h in store.text_search("u", "exchange", [term], 5)][:1] in (["e_u_1"], ["e_u_2"]), term
    assert store.text_search("u", "exchange", ["adopt"], 5)[0][0] == "e_u_1"
    assert store.text_search("u", "exchange", ["pottery"], 5) == []


def test_text_index_replace_and_partitioning(store: Store) -> None:
    store.insert_exchange(ex("u", 1))
    store.insert_exchange(ex("v", 1))
    store.put_topic(topic("u", "t1"))
    store.put_text("u", "exchange", "e_u_1", "violin lessons")
    store.put_text("v", "exchange", "e_v_1", "violin repair")
    store.put_text("u", "topic", "t1", "violin")
    assert [h[0] for h in store.text_search("u", "exchange", ["violin"], 5)] == ["e_u_1"]
    assert [h[0] for h in store.text_search("u", "topic", ["violin"], 5)] == ["t1"]
    store.put_text("u", "exchange", "e_u_1", "cello lessons")
    assert store.text_search("u", "exchange", ["violin"], 5) == []
    assert [h[0] for h in store.text_search("u", "exchange", ["cello"], 5)] == ["e_u_1"]
    store.delete_index("topic", "t1")
    assert store.text_search("u", "topic", ["violin"], 5) == []
    with pytest.raises(StoreError):
        store.put_text("u", "exchange", "no-such-exchange", "text")


# -- term statistics -----------------------------------------------------------------------------
def test_term_document_frequencies(store: Store) -> None:
    store.add_term_df("u", ["tea", "tea", "kyoto"])
    store.add_term_df("u", ["tea"])
    store.add_term_df("v", ["tea"])
    assert store.get_term_df("u", ["tea", "kyoto", "nope"]) == {"tea": 2, "kyoto": 1}
    store.add_term_df("u", ["kyoto"], delta=-5)
    assert store.get_term_df("u", ["kyoto"]) == {"kyoto": 0}
    assert store.get_term_df("v", ["tea", "kyoto"]) == {"tea": 1}
    assert store.get_term_df("u", []) == {}
    store.add_term_counts("u", {"tea": 3, "rain": 3, "kyoto": 1})  # a batch's frequencies
    assert store.get_term_df("u", ["tea", "rain", "kyoto"]) == {"tea": 5, "rain": 3, "kyoto": 1}


# -- transactions --------------------------------------------------------------------------------
def test_transaction_rolls_back_on_error(store: Store) -> None:
    with store.transaction("u"):
        store.insert_exchange(ex("u", store.next_seq("u")))
    with pytest.raises(RuntimeError), store.transaction("u"):
        seq = store.next_seq("u")
        store.insert_exchange(ex("u", seq))
        store.put_topic(topic("u", "t"))
        store.log_change("u", "create", "t", {})
        raise RuntimeError("boom")
    assert [e.seq for e in store.list_exchanges("u")] == [1]
    assert store.list_topics("u") == [] and store.list_changes("u") == []
    assert store.next_seq("u") == 2  # the rolled-back allocation is not lost for good


def test_nested_transaction_joins_outer(store: Store) -> None:
    with pytest.raises(ValueError), store.transaction("u"):
        store.insert_exchange(ex("u", 1))
        with store.transaction("u"):
            store.insert_exchange(ex("u", 2))
        raise ValueError("outer fails after inner finished")
    assert store.list_exchanges("u") == []
    with store.transaction("u"):
        with store.transaction("u"):
            store.insert_exchange(ex("u", 1))
        assert [e.seq for e in store.list_exchanges("u")] == [1]  # visible inside
    assert [e.seq for e in store.list_exchanges("u")] == [1]


def test_writes_outside_transaction_commit_on_their_own(store_factory: Callable[[], Store]) -> None:
    a, b = store_factory(), store_factory()
    a.insert_exchange(ex("u", 1))
    a.put_topic(topic("u", "t"))
    assert b.get_exchange("e_u_1") is not None and b.get_topic("t") is not None


# -- users and audit -----------------------------------------------------------------------------
def test_delete_user_removes_everything_of_that_user_only(store: Store) -> None:
    for user in ("gone", "kept"):
        with store.transaction(user):
            for _ in range(3):
                seq = store.next_seq(user)
                store.insert_exchange(ex(user, seq, "shared words here"))
                store.put_text(user, "exchange", f"e_{user}_{seq}", "shared words here")
            store.put_topic(topic(user, f"t_{user}"))
            store.put_text(user, "topic", f"t_{user}", "shared topic")
            store.put_vectors(user, "exchange", [f"e_{user}_1"], np.stack([unit(1, 1)]))
            store.put_vectors(user, "topic", [f"t_{user}"], np.stack([unit(1, 1)]))
            store.add_term_df(user, ["shared"])
            store.log_change(user, "create", f"t_{user}", {"n": 1})
    assert store.delete_user("gone") == 3
    assert store.list_users() == ["kept"]
    assert store.list_exchanges("gone") == [] and store.list_topics("gone") == []
    assert store.count_exchanges("gone") == {"pending": 0, "completed": 0, "failed": 0}
    assert store.vector_search("gone", "exchange", unit(1, 1), 5) == []
    assert store.vector_search("gone", "topic", unit(1, 1), 5) == []
    assert store.text_search("gone", "exchange", ["shared"], 5) == []
    assert store.text_search("gone", "topic", ["shared"], 5) == []
    assert store.get_term_df("gone", ["shared"]) == {}
    assert store.list_changes("gone") == []
    assert store.next_seq("gone") == 1  # a new user of the same name starts afresh
    # the other user is untouched
    assert len(store.list_exchanges("kept")) == 3
    assert len(store.text_search("kept", "exchange", ["shared"], 5)) == 3
    assert store.vector_search("kept", "topic", unit(1, 1), 5)[0][0] == "t_kept"
    assert store.get_term_df("kept", ["shared"]) == {"shared": 1}
    assert store.delete_user("nobody") == 0


def test_change_log_newest_first_with_filters(store: Store) -> None:
    ids = [store.log_change("u", f"act{i}", "t1" if i % 2 else "t2", {"i": i, "when": T0}) for i in range(5)]
    store.log_change("v", "act", "t1", {})
    assert len(set(ids)) == 5
    changes = store.list_changes("u")
    assert [c.id for c in changes] == ids[::-1]
    assert changes[0].detail == {"i": 4, "when": str(T0)}  # non-JSON values stored as str
    assert changes[0].at.tzinfo is not None
    assert abs((datetime.now(timezone.utc) - changes[0].at).total_seconds()) < 300
    assert [c.action for c in store.list_changes("u", "t1")] == ["act3", "act1"]
    assert len(store.list_changes("u", limit=2)) == 2
    assert [c.user_id for c in store.list_changes("v")] == ["v"]


def test_bulk_load_writes_what_the_contract_reads(store: Store) -> None:
    """Store.load_exchanges / load_topics / finish_load (the scale benchmark's loader; COPY on
    PostgreSQL): rows, vectors, lexical keys, the tree and the sequence counter."""
    exs = [ex("bulk", s, f"note {s} about {w}", topic="t1") for s, w in ((1, "violin"), (2, "garden"), (3, "taxes"))]
    store.load_exchanges("bulk", exs, np.stack([unit(1, 0), unit(0, 1), unit(1, 1)]),
                         [e.user_text for e in exs])
    root = topic("bulk", "r", kind="root")
    leaf = topic("bulk", "t1", "r", title="Notes", vec_sum=unit(1, 0) * 3)
    store.load_topics("bulk", [root, leaf], {"t1": "Notes violin garden taxes"})
    store.finish_load("bulk")
    assert [e.id for e in store.get_exchanges("bulk", [e.id for e in exs])] == [e.id for e in exs]
    assert store.vector_search("bulk", "exchange", unit(0, 1), 1)[0][0] == exs[1].id
    assert [i for i, _ in store.text_search("bulk", "exchange", ["garden"], 5)] == [exs[1].id]
    assert [i for i, _ in store.text_search("bulk", "topic", ["violin"], 5)] == ["t1"]
    assert store.vector_search("bulk", "topic", unit(1, 0), 1)[0][0] == "t1"
    assert set(store.get_topics("bulk", ["r", "t1"])) == {"r", "t1"}
    head = store.topic_heads("bulk", ["t1", "r", "nope"])
    assert set(head) == {"t1", "r"} and head["t1"].title == "Notes" and head["t1"].parent_id == "r"
    assert store.next_seq("bulk") == 4
    # the words recall reads are kept by the bulk path too (COPY on PostgreSQL: the record's
    # line breaks must survive its escaping)
    texts = store.exchange_texts("bulk", [e.id for e in exs])
    assert all(texts[e.id].tokens == token_record(e.user_text, e.assistant_text) for e in exs)
