"""Background placement (``Settings.placement = "background"``, ``backlog.py``): ``complete``
stores the reply and returns; a worker embeds and places in batches; reads wait for the queue.

Real SQLite files, the real hash and MiniLM embedders and the project's failing embedder; no
mock. The equivalence test compares the tables of inline and background one-by-one ingest of
the same exchanges.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from arbormem import Memory
from arbormem.aio import AsyncMemory
from arbormem.check import check
from arbormem.config import Settings
from arbormem.embed.testing import FlakyEmbedder, HashEmbedder
from arbormem.errors import EmbeddingError
from arbormem.eval.bench import synthetic_items

BACKGROUND = Settings(placement="background")


def _ingest(mem: Memory, items: list[dict[str, Any]], user: str = "u") -> list[str]:
    ids = []
    for it in items:
        msgs = it["messages"]
        x = mem.begin(msgs[0]["content"], user_id=user, session_id=it["session_id"], at=it["at"])
        done = mem.complete(x.id, msgs[1]["content"], at=it["at"])
        ids.append(done.id)
    return ids


def _tables(path: Path) -> dict[str, Any]:
    """What placement derives, keyed so two memories compare: topics by their member seqs
    (ids are random), vectors by exchange seq, full-text keys, term statistics."""
    conn = sqlite3.connect(path)
    try:
        seq_of = dict(conn.execute("SELECT id, seq FROM exchanges"))
        members: dict[str, list[int]] = {}
        for xid, topic in conn.execute("SELECT id, topic_id FROM exchanges WHERE status = 'completed'"):
            members.setdefault(topic, []).append(seq_of[xid])
        rows = {r[0]: r[1:] for r in conn.execute(
            "SELECT id, kind, parent_id, title, start_seq, end_seq, size, vec_sum FROM topics")}

        def span(tid: str) -> tuple[int, ...]:  # every seq below a node: a name independent of ids
            below = [c for c, r in rows.items() if r[1] == tid]
            return tuple(sorted(members.get(tid, []) + [s for c in below for s in span(c)]))

        topics = {span(t): (r[0], span(r[1]) if r[1] in rows and rows[r[1]][0] != "root" else None,
                            r[3], r[4], r[5]) for t, r in rows.items() if r[0] != "root"}
        titles = {span(t): r[2] for t, r in rows.items() if r[0] != "root"}
        vec_sums = {span(t): np.frombuffer(r[6], dtype=np.float32) for t, r in rows.items()
                    if r[0] != "root" and r[6] is not None}
        vectors = {seq_of[i]: np.frombuffer(v, dtype=np.float32) for i, v in conn.execute(
            "SELECT item_id, vec FROM vectors WHERE kind = 'exchange'")}
        keys = {seq_of[i]: b for i, b in conn.execute(
            "SELECT e.id, f.body FROM exchange_fts f JOIN exchanges e ON e.rid = f.rowid")}
        df = dict(conn.execute("SELECT term, df FROM term_df"))
        return {"topics": topics, "titles": titles, "vec_sums": vec_sums, "vectors": vectors,
                "keys": keys, "df": df, "exchange_topic": sorted(members.values())}
    finally:
        conn.close()


def test_background_places_as_inline_does(tmp_path: Path, minilm) -> None:
    """40 exchanges one by one, inline and in the background (batches of 8, so several
    batches and a remainder), with the real model: the same tree, vectors, keys, statistics."""
    items, _ = synthetic_items(40, seed=3)
    a, b = tmp_path / "inline.db", tmp_path / "background.db"
    with Memory(a, embedder=minilm) as m:
        _ingest(m, items)
    with Memory(b, embedder=minilm, settings=Settings(placement="background", placement_batch=8)) as m:
        _ingest(m, items)
        m.flush()
        assert check(m).ok
    ta, tb = _tables(a), _tables(b)
    # The partition of exchanges into topics, the tree's shape, sizes and spans: equal.
    assert ta["exchange_topic"] == tb["exchange_topic"]
    assert ta["topics"] == tb["topics"]
    # Lexical keys (own text + placed same-session neighbours) and term statistics: equal.
    assert ta["keys"] == tb["keys"]
    assert ta["df"] == tb["df"]
    # Vectors: a batch is padded to its longest text, so the model's arithmetic differs in the
    # last bits from embedding one text alone (cosine 1 - 1e-6); centroids sum them.
    assert ta["vectors"].keys() == tb["vectors"].keys()
    for seq, v in ta["vectors"].items():
        assert float(v @ tb["vectors"][seq]) > 1 - 1e-5, seq
    for span, v in ta["vec_sums"].items():
        np.testing.assert_allclose(v, tb["vec_sums"][span], atol=1e-4)
    # Titles come from term statistics at the moment a unit of work flushes the tree: inline
    # after every exchange, background once per batch (as add_many); most agree (all but one
    # of the four topics these 40 exchanges form).
    same = sum(ta["titles"][s] == tb["titles"][s] for s in ta["titles"])
    assert same >= 0.75 * len(ta["titles"]), (same, len(ta["titles"]))


def test_complete_returns_before_placement_and_reads_wait(db_path: Path) -> None:
    with Memory(db_path, embedder=HashEmbedder(), settings=BACKGROUND) as m:
        x = m.begin("my sourdough starter smells of acetone", user_id="u")
        done = m.complete(x.id, "feed it twice a day with rye flour")
        assert done.status == "completed" and done.topic_id is None
        r = m.recall("sourdough starter", user_id="u", recent=0, min_relevance=0)
        assert done.id in {e.id for e in r.exchanges}
        assert m.get(done.id).topic_id is not None
        assert m.stats(user_id="u").topics == 1
        assert not m.placement_errors


def test_failure_keeps_the_exchange_queued_and_is_retried(db_path: Path) -> None:
    emb = FlakyEmbedder(fail_on={1, 2})  # the worker's first batch and the first retry fail
    with Memory(db_path, embedder=emb, settings=BACKGROUND) as m:
        x = m.begin("which mortgage rate did the bank offer", user_id="u")
        m.complete(x.id, "3.1 percent fixed for ten years")
        deadline = time.monotonic() + 10
        while not m.placement_errors and time.monotonic() < deadline:
            time.sleep(0.01)  # the worker's batch fails first; it does not retry on its own
        assert len(m.placement_errors) == 1
        with pytest.raises(EmbeddingError):
            m.flush("u")  # retried here, fails again: raised, never swallowed
        assert m.placement_errors and m.placement_errors[-1].exchange_ids == (x.id,)
        assert "embedding server unavailable" in m.placement_errors[-1].error
        stored = m.get(x.id)
        assert stored.status == "completed" and stored.assistant_text.startswith("3.1")
        report = check(m)
        assert report.ok and report.users[0].queued == 1  # queued, not corrupt
        m.flush("u")  # the embedder is back: placed
        assert m.get(x.id).topic_id is not None
        assert check(m).users[0].queued == 0
        assert m.search("mortgage rate", user_id="u")[0].exchange.id == x.id


def test_close_places_what_is_queued(db_path: Path) -> None:
    items, _ = synthetic_items(30)
    with Memory(db_path, embedder=HashEmbedder(), settings=BACKGROUND) as m:
        _ingest(m, items)
    with Memory(db_path, embedder=HashEmbedder()) as m:
        report = check(m)
        assert report.ok and report.users[0].queued == 0 and report.users[0].completed == 30


def test_queued_left_by_another_memory_are_placed_on_first_use(db_path: Path) -> None:
    """What a crash leaves (completed, no topic) is placed by the next Memory's first read,
    inline mode included; and a second Memory flushing the same file places nothing twice."""
    items, _ = synthetic_items(20)
    a = Memory(db_path, embedder=HashEmbedder(), settings=Settings(placement="background",
                                                                    placement_close_timeout=0))
    b = Memory(db_path, embedder=HashEmbedder())
    try:
        ids = _ingest(a, items)
        b.flush()  # races a's worker on the same rows
        a.flush()
        assert all(b.get(i).topic_id for i in ids)
        assert check(b).ok
    finally:
        a.close()
        b.close()
    # a queue left behind: the embedder was down until the Memory closed
    more, _ = synthetic_items(25)
    with Memory(db_path, embedder=FlakyEmbedder(fail_on=range(1, 1000)), settings=BACKGROUND) as a:
        extra = _ingest(a, more[20:], user="v")
    with Memory(db_path, embedder=HashEmbedder()) as m:
        assert check(m).users[-1].queued == 5
        assert check(m).ok
        assert len(m.topics(user_id="v")) >= 1  # the first read places them
        assert all(m.get(i).topic_id for i in extra)
        assert check(m).users[-1].queued == 0


def test_deleting_a_queued_exchange_leaves_no_text(db_path: Path) -> None:
    emb = FlakyEmbedder(fail_on=range(2, 50))  # placement fails: the second exchange stays queued
    with Memory(db_path, embedder=emb, settings=BACKGROUND) as m:
        m.add([{"role": "user", "content": "plain first note"}, {"role": "assistant", "content": "ok"}],
              user_id="u", session_id="s")
        x = m.begin("the secret word is zanzibarite", user_id="u", session_id="s")
        m.complete(x.id, "noted")
        m.delete(x.id, user_id="u")  # deletion goes on past a failing placement
        assert m.placement_errors  # the placement was tried (and failed) first
        assert check(m).ok
    conn = sqlite3.connect(db_path)
    try:
        bodies = " ".join(r[0] for r in conn.execute("SELECT body FROM exchange_fts"))
        assert "zanzibarite" not in bodies
        assert conn.execute("SELECT COUNT(*) FROM exchanges WHERE id = ?", (x.id,)).fetchone()[0] == 0
    finally:
        conn.close()


def test_async_flush(db_path: Path) -> None:
    async def go() -> None:
        async with AsyncMemory(db_path, embedder=HashEmbedder(), settings=BACKGROUND) as m:
            x = await m.begin("violin strings keep snapping", user_id="u")
            await m.complete(x.id, "try a lower tension set")
            await m.flush("u", timeout=30)
            assert (await m.get(x.id)).topic_id is not None
            assert m.placement_errors == ()

    asyncio.run(go())


def test_flush_validates(db_path: Path) -> None:
    from arbormem.errors import StateError, ValidationError

    m = Memory(db_path, embedder=HashEmbedder(), settings=BACKGROUND)
    with pytest.raises(ValidationError):
        m.flush(timeout=-1)
    m.flush(timeout=9_223_372_037)  # past threading.TIMEOUT_MAX: no timeout (found by the API fuzz test)
    m.close()
    with pytest.raises(StateError):
        m.flush()


def test_postgres_background(pg_database: str) -> None:
    items, _ = synthetic_items(24)
    with Memory(database_url=pg_database, embedder=HashEmbedder(), settings=BACKGROUND) as m:
        ids = _ingest(m, items)
        tree = m.tree(user_id="u")  # waits for the queue
        assert sum(t.size for t in tree.children) == 24
        assert all(m.get(i).topic_id for i in ids)
        assert m.store.unplaced("u", 10) == []


def test_a_vector_without_a_topic_is_reported_not_placed_over(db_path: Path) -> None:
    """Damage (a vector written around the write path) is never placed over or looped on."""
    from arbormem.errors import StateError

    emb = FlakyEmbedder(fail_on={1})
    with Memory(db_path, embedder=emb, settings=BACKGROUND) as m:
        x = m.begin("ferry times to the island", user_id="u")
        m.complete(x.id, "the 9:40 boat")
        deadline = time.monotonic() + 10
        while not m.placement_errors and time.monotonic() < deadline:
            time.sleep(0.01)
        m.store.put_vectors("u", "exchange", [x.id], HashEmbedder().embed(["damage"]))
        with pytest.raises(StateError, match="check --repair"):
            m.flush("u")
        assert m.get(x.id).topic_id is None
        assert not check(m).ok
        assert check(m, repair=True).ok
        assert m.get(x.id).topic_id is not None
