"""SQLite-only lexical search behaviour: common query terms do not make a search linear."""

from __future__ import annotations

from pathlib import Path

import pytest

from arbormem.store import sqlite as sqlite_store
from arbormem.store.sqlite import SQLiteStore

from .test_contract import ex


def test_common_terms_are_left_out_while_a_rarer_term_remains(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_store, "COMMON_DF", 10)
    store = SQLiteStore(tmp_path / "m.db")
    try:
        bodies = [f"alice talked about the weather, day {i}" for i in range(30)]
        bodies += ["alice fixed the kubernetes cluster", "bob read about kubernetes"]
        for seq, body in enumerate(bodies, start=1):
            store.insert_exchange(ex("u", seq, body))
            store.put_text("u", "exchange", f"e_u_{seq}", body)
            store.add_term_df("u", sorted({w.strip(",") for w in body.split()}))
        # "alice" is in 31 exchanges (> 10): only "kubernetes" is searched, so a document
        # holding just the common word is not a candidate any more.
        hits = store.text_search("u", "exchange", ["alice", "kubernetes"], 50)
        assert {h[0] for h in hits} == {"e_u_31", "e_u_32"}
        # Only common terms: the rarest one is kept, so a search never comes back empty for that.
        only_common = store.text_search("u", "exchange", ["alice", "weather"], 50)
        assert len(only_common) == 30 and all(h[0] not in ("e_u_32",) for h in only_common)
        # Another user's statistics do not count.
        assert store.get_term_df("v", ["alice"]) == {}
        monkeypatch.setattr(sqlite_store, "COMMON_DF", 1000)
        assert len(store.text_search("u", "exchange", ["alice", "kubernetes"], 50)) == 32
    finally:
        store.close()


def test_terms_in_a_large_share_of_a_big_memory_are_left_out(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Above COMMON_MIN_DF documents, a term held by more than COMMON_SHARE of the user's
    exchanges is left out too (here "alice": 31 of 40); one in fewer ("tea": 8) stays."""
    store = SQLiteStore(tmp_path / "m.db")
    try:
        bodies = [f"alice on day {i}" + (" with tea" if i < 8 else "") for i in range(31)]
        bodies += [f"bob on day {i}" for i in range(9)]
        for seq, body in enumerate(bodies, start=1):
            store.insert_exchange(ex("u", seq, body))
            store.put_text("u", "exchange", f"e_u_{seq}", body)
            store.add_term_df("u", sorted(set(body.split())))
        both = store.text_search("u", "exchange", ["alice", "tea"], 50)
        assert len(both) == 31  # below COMMON_MIN_DF: every alice document is a candidate
        monkeypatch.setattr(sqlite_store, "COMMON_MIN_DF", 5)
        rare = store.text_search("u", "exchange", ["alice", "tea"], 50)
        assert {h[0] for h in rare} == {f"e_u_{i}" for i in range(1, 9)}
        # the tea documents rank as before among themselves (alice weighed ~nothing there)
        assert [h[0] for h in rare] == [h[0] for h in both if h[0] in {x[0] for x in rare}]
    finally:
        store.close()


def test_a_user_owning_most_rows_is_searched_without_the_user_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Matching the terms alone and filtering the user's rows after gives the same hits and
    scores as the user token in the MATCH, for the big user and the small one alike."""
    store = SQLiteStore(tmp_path / "m.db")
    try:
        for user, n in (("big", 40), ("small", 8)):
            for seq in range(1, n + 1):
                body = f"{user} note {seq} about {'kubernetes' if seq % 3 else 'weather'} and {'tea' if seq % 2 else 'coffee'}"
                store.insert_exchange(ex(user, seq, body))
                store.put_text(user, "exchange", f"e_{user}_{seq}", body)
        for user, owns in (("big", True), ("small", False)):
            mine, top = store._partition(user)
            assert (mine >= sqlite_store.OWNER_SHARE * top) is owns
        queries = (["kubernetes", "tea"], ["weather"], ["coffee", "note"])
        got = {(u, tuple(q)): store.text_search(u, "exchange", list(q), 10) for u in ("big", "small") for q in queries}
        monkeypatch.setattr(sqlite_store, "OWNER_SHARE", 2.0)  # never: the token in the MATCH
        for (u, q), hits in got.items():
            assert hits and all(h[0].startswith(f"e_{u}_") for h in hits)
            other = store.text_search(u, "exchange", list(q), 10)
            assert [h[0] for h in hits] == [h[0] for h in other]
            assert [h[1] for h in hits] == pytest.approx([h[1] for h in other], rel=1e-9, abs=1e-12)
        monkeypatch.setattr(sqlite_store, "OWNER_SHARE", 0.0)  # always
        for (u, q), hits in got.items():
            assert [h[0] for h in store.text_search(u, "exchange", list(q), 10)] == [h[0] for h in hits]
    finally:
        store.close()


def test_a_sole_user_is_ranked_inside_the_index_with_the_same_hits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With every row the user's, the k winners are ranked inside FTS5 and only they are looked
    up: the same hits, scores and order (ties included) as joining every match first; a
    full-text row left without its exchange sends the search back to the join."""
    store = SQLiteStore(tmp_path / "m.db")
    try:
        for seq in range(1, 61):  # repeated bodies: equal BM25 scores, ties at every k
            body = f"note about {'kubernetes' if seq % 3 else 'weather'} and {'tea' if seq % 2 else 'coffee'}"
            store.insert_exchange(ex("u", seq, body))
            store.put_text("u", "exchange", f"e_u_{seq}", body)
        assert store._sole_user("exchange", "u")
        queries = (["kubernetes", "tea"], ["weather"], ["coffee", "note"], ["absent"])
        ks = (1, 5, 10, 25, 100)
        got = {(tuple(q), k): store.text_search("u", "exchange", q, k) for q in queries for k in ks}
        with monkeypatch.context() as m:
            m.setattr(SQLiteStore, "_sole_user", lambda *_: False)
            for (q, k), hits in got.items():
                assert store.text_search("u", "exchange", list(q), k) == hits
        # An exchange row gone without its full-text row: left out, as the join leaves it out.
        best = got[(("weather",), 5)][0][0]
        store._exec("DELETE FROM exchanges WHERE id = ?", (best,))
        hits = store.text_search("u", "exchange", ["weather"], 5)
        assert best not in {h[0] for h in hits} and len(hits) == 5
        with monkeypatch.context() as m:
            m.setattr(SQLiteStore, "_sole_user", lambda *_: False)
            assert store.text_search("u", "exchange", ["weather"], 5) == hits
        # Another user's row: no longer the sole user.
        store.insert_exchange(ex("v", 1, "weather"))
        assert not store._sole_user("exchange", "u")
    finally:
        store.close()


def test_kept_document_frequencies_follow_every_write(tmp_path: Path) -> None:
    """Document frequencies kept between reads: a write by this connection, a commit by
    another one, and a rolled-back transaction all show in the next read."""
    store, other = SQLiteStore(tmp_path / "m.db"), SQLiteStore(tmp_path / "m.db")
    try:
        store.add_term_df("u", ["tea", "coffee"])
        assert store.get_term_df("u", ["tea", "coffee", "absent"]) == {"tea": 1, "coffee": 1}
        assert store.get_term_df("u", ["tea", "absent"]) == {"tea": 1}  # kept, absent kept as absent
        store.add_term_df("u", ["tea", "absent"])
        assert store.get_term_df("u", ["tea", "absent", "coffee"]) == {"tea": 2, "absent": 1, "coffee": 1}
        other.add_term_df("u", ["coffee", "new"])
        assert store.get_term_df("u", ["coffee", "new"]) == {"coffee": 2, "new": 1}
        with pytest.raises(RuntimeError):
            with store.transaction("u"):
                store.add_term_df("u", ["tea"])
                assert store.get_term_df("u", ["tea"]) == {"tea": 3}  # this transaction's count
                raise RuntimeError("rolled back")
        assert store.get_term_df("u", ["tea"]) == {"tea": 2}
        assert store.get_term_df("v", ["tea"]) == {}
    finally:
        store.close()
        other.close()
