"""``Memory.reembed`` and ``arbormem reembed``: moving a memory to another embedder.

Real stores (a SQLite file, and a real PostgreSQL via ``tests/support/postgres.py``), the
deterministic HashEmbedder at two dimensions (64 -> 384), and small real embedders that fail
or return garbage. Also the store-level guarantees re-embedding relies on: SQLite's vector
cache and ANN graph follow a dimension change and forget a rolled-back transaction's vectors.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from arbormem import ConfigError, EmbeddingError, Memory
from arbormem.check import check
from arbormem.embed import Embedder
from arbormem.embed.testing import BrokenEmbedder, HashEmbedder
from arbormem.models import ReembedProgress
from arbormem.organize.aliases import alias_id
from arbormem.organize.consolidate import ConsolidationOptions
from arbormem.reembed import REEMBED_KEY
from arbormem.store.base import Store
from arbormem.store.sqlite import SQLiteStore
from tests.conftest import chat
from tests.support.subjects import SUBJECTS, T0

OLD, NEW = "hash:64", "hash:384"
OLD_SPEC, NEW_SPEC = "hash-64:64", "hash-384:384"
CAT_QUESTION = "what is the name of my sister's cat?"



def conversation(n: int, seed: int) -> list[dict]:
    """Subjects revisited in separate sessions, so consolidation finds topics to merge."""
    rng = random.Random(seed)
    items, subject = [], "garden"
    for i in range(n):
        if i % 4 == 0:
            subject = rng.choice(list(SUBJECTS))
        words = SUBJECTS[subject].split()
        items.append({"messages": chat(" ".join(rng.choice(words) for _ in range(8)) + f" ({i})",
                                       " ".join(rng.choice(words) for _ in range(8))),
                      "session_id": f"s{i // 12}", "at": T0 + timedelta(hours=i)})
    return items


def build(mem: Memory) -> str:
    """Two users, a merged topic (aliases), a pending and a failed exchange; returns the id
    of the exchange the cat question must find."""
    # Placement sends a returning subject home to its earlier topic, which leaves
    # consolidation nothing to merge: here returns open new topics, as older trees have them.
    thread_threshold = mem.settings.tree.thread_threshold
    mem.settings.tree.thread_threshold = 1.1
    mem.add_many(conversation(72, seed=3), user_id="a")
    mem.settings.tree.thread_threshold = thread_threshold
    cat = mem.add(chat("my sister's cat is called pumpernickel and sleeps all day",
                       "pumpernickel is a lovely name for a cat"), user_id="a",
                  session_id="pets", at=T0 + timedelta(days=10))
    mem.begin("still waiting for an answer about the kyoto train", user_id="a")
    mem.fail(mem.begin("this reply never came", user_id="a").id, "timeout")
    mem.add_many(conversation(30, seed=5), user_id="b")
    report = mem.consolidate("a", options=ConsolidationOptions(archive=False, dedup=False, supersede=False))
    assert report.merged and aliases(mem.store, "a"), "the scenario needs merged topics"
    return cat.id


def aliases(store: Store, uid: str) -> set[str]:
    return {alias_id(t.id, p) for t in store.list_topics(uid) for p in t.meta.aliases}


def vector_rows(store: Store, uid: str) -> dict[tuple[str, str], np.ndarray]:
    """Every stored vector of the user, read from the backend itself (not via known ids)."""
    if isinstance(store, SQLiteStore):
        rows = store._conn.execute("SELECT kind, item_id, vec FROM vectors WHERE user_id = ?", (uid,))
        return {(k, i): np.frombuffer(b, dtype=np.float32).copy() for k, i, b in rows}
    out: dict[tuple[str, str], np.ndarray] = {}
    for kind in ("exchange", "topic"):
        ids = store.iter_vector_ids(uid, kind)  # type: ignore[attr-defined]
        out.update({(kind, i): v for i, v in store.get_vectors(uid, kind, ids).items()})
    return out


def same_rows(a: dict[tuple[str, str], np.ndarray], b: dict[tuple[str, str], np.ndarray]) -> bool:
    return set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)


def expected_sums(store: Store, uid: str) -> dict[str, np.ndarray | None]:
    """Topic vector sums recomputed from the stored exchange vectors: a leaf sums its
    members, an inner node its children (organize/tree.py)."""
    topics = {t.id: t for t in store.list_topics(uid)}
    members = [e for e in store.iter_exchanges(uid) if e.topic_id]
    vecs = store.get_vectors(uid, "exchange", [e.id for e in members])
    leaf: dict[str, np.ndarray] = {}
    for e in members:
        if e.id in vecs:
            assert e.topic_id is not None
            leaf[e.topic_id] = leaf.get(e.topic_id, 0) + vecs[e.id].astype(np.float64)
    kids: dict[str, list[str]] = {}
    for t in topics.values():
        if t.parent_id:
            kids.setdefault(t.parent_id, []).append(t.id)

    def total(tid: str) -> np.ndarray | None:
        if topics[tid].kind == "topic":
            return leaf.get(tid)
        parts = [s for s in (total(c) for c in kids.get(tid, [])) if s is not None]
        return np.sum(parts, axis=0) if parts else None

    return {tid: total(tid) for tid in topics}


def assert_topics_consistent(store: Store, uid: str, dim: int) -> None:
    want = expected_sums(store, uid)
    stored = store.get_vectors(uid, "topic", list(want))
    for t in store.list_topics(uid):
        exp = want[t.id]
        assert exp is not None and t.vec_sum is not None and t.vec_sum.shape == (dim,)
        assert np.allclose(t.vec_sum, exp, atol=1e-4), t.id
        if t.kind != "root":
            assert np.allclose(stored[t.id], exp / np.linalg.norm(exp), atol=1e-5), t.id


class Flaky(Embedder):
    """The new embedder, but its backend fails on the ``fail_on``-th call."""

    def __init__(self, dim: int, fail_on: int | None = None) -> None:
        self.inner = HashEmbedder(dim)
        self.name = self.inner.name
        self.fail_on = fail_on
        self.calls = 0

    @property
    def dim(self) -> int:
        return self.inner.dim

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        if self.calls == self.fail_on:
            raise RuntimeError("embedding service went away")
        return self.inner.embed_batch(texts)


class Unchecked(HashEmbedder):
    """An embedder that overrides ``embed`` and skips its validation, returning a NaN."""

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = super().embed(texts)
        out[0, 0] = np.nan
        return out


# -- the core scenario, on SQLite and PostgreSQL ------------------------------------------------
def test_reembed_moves_every_vector_to_the_new_embedder(store_factory: Callable[[], Store]) -> None:
    with Memory(store=store_factory(), embedder=OLD) as mem:
        cat = build(mem)
        before = {u: vector_rows(mem.store, u) for u in ("a", "b")}
        dropped = aliases(mem.store, "a")
        pending_ids = {e.id for e in mem.exchanges(user_id="a") if e.status != "completed"}

    seen: list[ReembedProgress] = []
    with Memory(store=store_factory(), embedder=NEW) as mem:
        with pytest.raises(ConfigError, match="re-embed"):
            mem.recall(CAT_QUESTION, user_id="a")
        report = mem.reembed(batch_size=16, progress=seen.append)
        assert report.complete and report.users == ("a", "b") and not report.pending
        assert (report.embedder, report.previous) == (NEW_SPEC, OLD_SPEC)
        assert report.exchanges == 73 + 30 and report.aliases_dropped == len(dropped)
        assert mem.store.get_meta("embedder") == NEW_SPEC and not mem.store.get_meta(REEMBED_KEY)
        # progress after every batch: a's 73 vectors in 5 batches, then b's 30 in 2
        assert [(p.user_id, p.done, p.total) for p in seen] == [
            ("a", 16, 73), ("a", 32, 73), ("a", 48, 73), ("a", 64, 73), ("a", 73, 73),
            ("b", 16, 30), ("b", 30, 30)]

        for u in ("a", "b"):
            after = vector_rows(mem.store, u)
            # the same vectors, minus the merged topics' part vectors, all of the new model
            assert set(after) == set(before[u]) - {("topic", a) for a in dropped}
            assert {v.shape for v in after.values()} == {(384,)}
            assert not pending_ids & {i for _, i in after}
            assert_topics_consistent(mem.store, u, 384)
        assert not aliases(mem.store, "a")
        emb = HashEmbedder(384)
        x = mem.get(cat)
        assert np.allclose(mem.store.get_vectors("a", "exchange", [cat])[cat], emb.embed_one(x.text))

        # the memory works with the new embedder, reads and writes
        assert cat in {e.id for e in mem.recall(CAT_QUESTION, user_id="a", max_tokens=400).exchanges}
        assert mem.search(CAT_QUESTION, user_id="a", limit=3)[0].exchange.id == cat
        mem.add(chat("the cat also likes tuna", "noted"), user_id="a", session_id="pets")
        if isinstance(mem.store, SQLiteStore):
            result = check(mem)
            assert result.ok, [str(p) for u in result.users for p in u.problems]
        # nothing left to do
        again = mem.reembed()
        assert again.complete and again.exchanges == 0 and not again.users

    with Memory(store=store_factory(), embedder=OLD) as old, pytest.raises(ConfigError, match="hash-384:384"):
        old.recall(CAT_QUESTION, user_id="a")


def test_an_interrupted_reembed_resumes_where_it_stopped(store_factory: Callable[[], Store]) -> None:
    with Memory(store=store_factory(), embedder=OLD) as mem:
        cat = build(mem)
    store = store_factory()
    flaky = Flaky(384)
    mem = Memory(store=store, embedder=flaky)
    before = {u: vector_rows(store, u) for u in ("a", "b")}

    def untouched(u: str) -> None:
        assert same_rows(vector_rows(store, u), before[u])

    # 1. the first user's second batch fails: nothing at all changed, the memory still works
    flaky.fail_on = 2
    with pytest.raises(EmbeddingError, match="went away"):
        mem.reembed(batch_size=16)
    untouched("a")
    untouched("b")
    assert store.get_meta("embedder") == OLD_SPEC and not store.get_meta(REEMBED_KEY)
    with Memory(store=store_factory(), embedder=OLD) as old:
        assert old.search(CAT_QUESTION, user_id="a")[0].exchange.id == cat

    # 2. the second user's second batch fails (a takes 5 batches): a is done, b untouched
    flaky.calls, flaky.fail_on = 0, 7
    with pytest.raises(EmbeddingError):
        mem.reembed(batch_size=16)
    assert {v.shape for v in vector_rows(store, "a").values()} == {(384,)}
    untouched("b")
    assert store.get_meta("embedder") == OLD_SPEC
    assert json.loads(store.get_meta(REEMBED_KEY) or "") == {"target": NEW_SPEC, "done": ["a"]}
    # half way, neither model may read or write
    for spec in (OLD, NEW):
        with Memory(store=store_factory(), embedder=spec) as other, pytest.raises(ConfigError, match="re-embed"):
            other.add(chat("hello", "hi"), user_id="b")

    # 3. a second call skips the finished user and completes
    flaky.fail_on = None
    report = mem.reembed(batch_size=16)
    assert report.complete and report.skipped == ("a",) and report.users == ("b",)
    assert report.exchanges == 30 and store.get_meta("embedder") == NEW_SPEC
    for u in ("a", "b"):
        assert {v.shape for v in vector_rows(store, u).values()} == {(384,)}
        assert_topics_consistent(store, u, 384)
    assert mem.search(CAT_QUESTION, user_id="a")[0].exchange.id == cat
    if isinstance(store, SQLiteStore):
        assert check(mem).ok
    else:
        # the HNSW index of the new dimension exists, though the first one that created it
        # (step 1) was rolled back in this same process
        with store._conn() as conn:  # type: ignore[attr-defined]
            assert conn.execute("SELECT EXISTS (SELECT 1 FROM pg_class WHERE relname = "
                                "'arbormem_vectors_hnsw_384')").fetchone()[0]
        assert "384" in (store.get_meta("pg_vector_dims") or "").split(",")
    mem.close()


# -- SQLite-only scenarios ---------------------------------------------------------------------
@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "memory.db"
    with Memory(path, embedder=OLD) as mem:
        build(mem)
    return path


@pytest.mark.parametrize("bad", [lambda: BrokenEmbedder("nan", dim=384), lambda: BrokenEmbedder("shape", dim=384),
                                 lambda: Unchecked(384)], ids=["nan", "shape", "unchecked-nan"])
def test_garbage_output_raises_and_writes_nothing(db: Path, bad: Callable[[], Embedder]) -> None:
    with Memory(db, embedder=OLD) as mem:
        before = {u: vector_rows(mem.store, u) for u in ("a", "b")}
    with Memory(db, embedder=bad()) as mem, pytest.raises(EmbeddingError):
        mem.reembed()
    with Memory(db, embedder=OLD) as mem:
        for u in ("a", "b"):
            assert same_rows(vector_rows(mem.store, u), before[u])
        assert mem.store.get_meta("embedder") == OLD_SPEC and not mem.store.get_meta(REEMBED_KEY)
        assert mem.recall(CAT_QUESTION, user_id="a").exchanges  # still usable as it was
        assert check(mem).ok


def test_one_user_at_a_time_switches_the_mark_after_the_last(db: Path) -> None:
    with Memory(db, embedder=NEW) as mem:
        first = mem.reembed(user_id="b")
        assert first.users == ("b",) and first.pending == ("a",) and not first.complete
        assert mem.store.get_meta("embedder") == OLD_SPEC
        with pytest.raises(ConfigError, match="1 user"):
            mem.search("pumpernickel", user_id="b")
        second = mem.reembed(user_id="a")
        assert second.users == ("a",) and second.complete and not second.pending
        assert mem.store.get_meta("embedder") == NEW_SPEC
        assert mem.search(CAT_QUESTION, user_id="a")[0].exchange.user_text.startswith("my sister's cat")
        assert check(mem).ok


def test_same_embedder_is_a_no_op_unless_forced(db: Path) -> None:
    with Memory(db, embedder=OLD) as mem:
        before = vector_rows(mem.store, "a")
        noop = mem.reembed()
        assert noop.complete and noop.exchanges == 0 and not noop.users and noop.previous == OLD_SPEC
        assert same_rows(vector_rows(mem.store, "a"), before)
        forced = mem.reembed(force=True)
        assert forced.complete and forced.users == ("a", "b") and forced.exchanges == 103
        after = vector_rows(mem.store, "a")
        # same model: exchange vectors come back equal; aliases are gone, topics recomputed
        assert all(np.allclose(after[k], before[k], atol=1e-6) for k in after if k[0] == "exchange")
        assert set(after) == set(before) - {("topic", a) for a in aliases_of_vectors(before)}
        assert_topics_consistent(mem.store, "a", 64)
        assert check(mem).ok


def aliases_of_vectors(rows: dict[tuple[str, str], np.ndarray]) -> set[str]:
    return {i for k, i in rows if k == "topic" and "~" in i}


def test_cli_reembed(db: Path, tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "arbormem.cli", "reembed", *args],
                              capture_output=True, text=True, timeout=120)

    out = run(str(db), "--embedder", NEW, "--user", "b", "--batch-size", "16")
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == ["b: 16/30 exchanges", "b: 30/30 exchanges"]
    assert "1 user(s) still to re-embed (a)" in out.stdout
    out = run(str(db), "--embedder", NEW, "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["complete"] and report["users"] == ["a"] and report["skipped"] == ["b"]
    assert report["embedder"] == NEW_SPEC and report["exchanges"] == 73
    assert run(str(db), "--embedder", NEW).stdout.startswith("the memory already uses hash-384:384")
    with Memory(db, embedder=NEW) as mem:
        assert check(mem).ok
        assert mem.search(CAT_QUESTION, user_id="a")[0].exchange.user_text.startswith("my sister's cat")
    bad = run(str(tmp_path / "missing.db"), "--embedder", NEW)
    assert bad.returncode == 2 and bad.stderr.startswith("error: no SQLite memory")
    assert not (tmp_path / "missing.db").exists()


# -- the SQLite store under a re-embed --------------------------------------------------------
def units(n: int, dim: int, seed: int) -> np.ndarray:
    m = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def test_sqlite_vector_cache_follows_a_dimension_change(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "v.db")
    ids = [f"e{i}" for i in range(20)]
    old, new = units(20, 8, 1), units(20, 16, 2)
    store.put_vectors("u", "exchange", ids, old)
    assert store.vector_search("u", "exchange", old[3], 1)[0][0] == "e3"  # the cache is warm
    with store.transaction("u"):
        store.put_vectors("u", "exchange", ids, new)  # used to fail patching 8-d cached rows
    top = store.vector_search("u", "exchange", new[5], 3)
    assert top[0][0] == "e5" and math.isclose(top[0][1], 1.0, abs_tol=1e-5)
    store.close()


def test_sqlite_rollback_leaves_no_uncommitted_vector_in_the_cache(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "v.db")
    vecs = units(4, 8, 3)
    store.put_vectors("u", "exchange", ["e0", "e1", "e2"], vecs[:3])
    assert store.vector_search("u", "exchange", vecs[0], 1)[0][0] == "e0"
    with pytest.raises(RuntimeError), store.transaction("u"):
        store.put_vectors("u", "exchange", ["e0"], vecs[3:4])  # patches the cached row
        store.put_vectors("u", "exchange", ["ghost"], vecs[1:2])  # a new row...
        assert store.vector_search("u", "exchange", vecs[1], 2)  # ...loaded into the cache
        raise RuntimeError("rolled back")
    # the rolled-back rowid is handed out again: the cache must see the row that has it now
    store.put_vectors("u", "exchange", ["e3"], vecs[3:4])
    hits = dict(store.vector_search("u", "exchange", vecs[0], 10))
    assert set(hits) == {"e0", "e1", "e2", "e3"}
    assert math.isclose(hits["e0"], 1.0, abs_tol=1e-5)  # the committed vector, not the patch
    store.close()


def test_sqlite_ann_graph_is_never_stale_after_a_reembed(tmp_path: Path) -> None:
    pytest.importorskip("usearch", reason="approximate search needs usearch (pip install 'arbormem[ann]')")
    path = tmp_path / "v.db"
    ids = [f"e{i}" for i in range(120)]
    key = ("u", "exchange")

    def open_store() -> SQLiteStore:
        s = SQLiteStore(path, ann_threshold=32)
        s._ann_background_rows = 10**9  # build the graph in the searching thread
        return s

    def exact_top(store: SQLiteStore, m: np.ndarray, q: int) -> None:
        found = store.vector_search("u", "exchange", m[q], 5)
        assert found[0][0] == f"e{q}" and math.isclose(found[0][1], 1.0, abs_tol=1e-5)
        want = np.argsort(-(m @ m[q]))[:5]
        assert [i for i, _ in found] == [f"e{j}" for j in want]

    store = open_store()
    m8 = units(120, 8, 4)
    store.put_vectors("u", "exchange", ids, m8)
    exact_top(store, m8, 7)
    assert store._ann[key].mirror.dim == 8 and store._ann[key].mirror.n == 120
    # into another dimension, in this process: the cache and its graph are replaced
    m16 = units(120, 16, 5)
    with store.transaction("u"):
        store.put_vectors("u", "exchange", ids, m16)
    exact_top(store, m16, 11)
    assert store._ann[key].mirror.dim == 16
    # the same dimension, every vector rewritten: a new cache, the graph reconciled or rebuilt
    m16b = units(120, 16, 6)
    rebuilds = store._ann[key].mirror.rebuilds
    with store.transaction("u"):
        store.put_vectors("u", "exchange", ids, m16b)
    exact_top(store, m16b, 13)
    assert store._ann[key].mirror.rebuilds == rebuilds + 1  # not 120 patches replayed in a search
    store.close()
    # another process: the saved 16-d graph is checked against the vectors, never trusted
    reopened = open_store()
    exact_top(reopened, m16b, 17)
    reopened.close()
    # a process that saved an 8-d graph, then a re-embed elsewhere: the old graph is refused
    other = open_store()
    with other.transaction("u"):
        other.put_vectors("u", "exchange", ids, m8)
    exact_top(other, m8, 19)
    other.close()
    final = open_store()
    with final.transaction("u"):
        final.put_vectors("u", "exchange", ids, m16)
    exact_top(final, m16, 23)
    assert final._ann[key].mirror.dim == 16
    final.close()
