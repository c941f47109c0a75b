"""Helpers of the consolidation tests: conversations that fragment, and a full structural
check of a user's tree and indexes (what must hold after every consolidation and undo)."""

from __future__ import annotations

import json
import random
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from arbormem import Memory
from arbormem.config import Settings
from arbormem.models import Exchange
from arbormem.organize.aliases import alias_id, alias_owner, is_alias
from arbormem.text import terms
from tests.conftest import chat
from tests.support.subjects import SUBJECTS, T0

#: Our subject histories and segmentation sets (benchmarks/data/README.md).
DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data"


def history(file: str, name: str) -> list[dict]:
    """The exchanges of the history in ``benchmarks/data/<file>`` whose name starts with ``name``."""
    return next(h for h in json.loads((DATA / file).read_text()) if h["name"].startswith(name))["exchanges"]


def add_history(mem: Memory, rows: list[dict], user_id: str = "u") -> list[Exchange]:
    """Add a history's exchanges (user, assistant, session, time) in one call, as ``arbormem
    eval subjects`` does; the stored exchanges in order."""
    return mem.add_many([{"messages": [{"role": "user", "content": x["user"]},
                                       {"role": "assistant", "content": x["assistant"]}],
                          "session_id": x["session"], "at": x["at"]} for x in rows], user_id=user_id)


def default_settings(**tree: object) -> Settings:
    """The settings a default ``Memory`` reads (the environment included: this package's
    fixture below sets the thread threshold there, which an explicit ``TreeSettings`` would not
    read), with ``tree`` overriding some tree settings."""
    base = Settings()
    return base.model_copy(update={"tree": base.tree.model_copy(update=tree)})


@pytest.fixture(autouse=True)
def _placement_leaves_fragments(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about consolidation: placement must leave it fragments to merge. Today's
    placement sends a returning subject home itself (same thread), so it is turned off here,
    as in a memory written by an earlier version (thread_threshold above any cosine)."""
    monkeypatch.setenv("ARBORMEM_TREE__THREAD_THRESHOLD", "2.0")


@pytest.fixture
def real_placement(_placement_leaves_fragments: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """For tests of placement itself (or of a step judged on the tree placement really builds):
    same-thread returns on again, as in a default memory. Use it for a whole module with
    ``pytestmark = pytest.mark.usefixtures("real_placement")``."""
    monkeypatch.delenv("ARBORMEM_TREE__THREAD_THRESHOLD", raising=False)


def placed_leaves(mem: Memory, rows: list[dict], user_id: str = "u") -> list[str]:
    """Add a history's exchanges (``add_history``) and return each one's leaf, in order."""
    added = add_history(mem, rows, user_id)
    topic_of = {e.id: e.topic_id for e in mem.exchanges(user_id=user_id)}
    return [topic_of[e.id] or "" for e in added]


def partition(labels: list) -> list[int]:  # type: ignore[type-arg]
    """Labels renumbered in order of first appearance (two segmentations compare as partitions:
    topic ids are random)."""
    seen: dict[object, int] = {}
    return [seen.setdefault(x, len(seen)) for x in labels]


def fragmented(n: int, seed: int = 3, per_session: int = 12) -> list[dict]:
    """A conversation that keeps coming back to the same subjects in separate sessions, so
    the same subject ends up in many separate topics (what consolidation should fix)."""
    rng = random.Random(seed)
    names = list(SUBJECTS)
    items, subject = [], names[0]
    for i in range(n):
        if i % 4 == 0:
            subject = rng.choice(names)
        words = SUBJECTS[subject].split()
        u = " ".join(rng.choice(words) for _ in range(8))
        a = " ".join(rng.choice(words) for _ in range(8))
        items.append({"messages": chat(f"{u} ({i})", a), "session_id": f"s{i // per_session}",
                      "at": T0 + timedelta(hours=i)})
    return items


def check_tree(mem: Memory, uid: str) -> dict[str, int]:
    """Assert every structural invariant of a user's tree and its indexes; return counts."""
    store = mem.store
    recs = {r.id: r for r in store.list_topics(uid)}
    roots = [r for r in recs.values() if r.kind == "root"]
    assert len(roots) == 1
    root = roots[0]
    kids: dict[str, list[str]] = {}
    for r in recs.values():
        if r.parent_id is not None:
            assert r.parent_id in recs, f"{r.id} has a missing parent"
            kids.setdefault(r.parent_id, []).append(r.id)
    completed = [e for e in store.iter_exchanges(uid) if e.status == "completed"]
    by_topic: dict[str, list] = {}
    for e in completed:
        assert e.topic_id in recs and recs[e.topic_id].kind == "topic", f"exchange {e.seq} lost its topic"
        by_topic.setdefault(e.topic_id, []).append(e)
    vecs = store.get_vectors(uid, "exchange", [e.id for e in completed])
    depths = set()
    for r in recs.values():
        if r.kind == "topic":
            members = by_topic.get(r.id, [])
            assert r.size == len(members) > 0, f"topic {r.id} size {r.size} != {len(members)}"
            assert r.start_seq == min(e.seq for e in members) and r.end_seq == max(e.seq for e in members)
            assert np.allclose(r.vec_sum, np.sum([vecs[e.id] for e in members], axis=0), atol=1e-3)
            assert r.id not in kids
            d, node = 0, r
            while node.parent_id is not None:
                node, d = recs[node.parent_id], d + 1
            depths.add(d)
        elif r.kind == "theme":
            ch = kids.get(r.id, [])
            assert ch, f"empty theme {r.id}"
            assert r.size == sum(recs[c].size for c in ch)
            assert r.start_seq == min(recs[c].start_seq for c in ch)
        limit = mem.settings.tree.root_children if r.kind == "root" else mem.settings.tree.max_children
        assert len(kids.get(r.id, [])) <= limit
        for other in r.meta.links:
            assert other in recs, f"dangling link {r.id} -> {other}"
            assert r.id in recs[other].meta.links, "links must be both ways"
    assert root.size == len(completed)
    # Topics sit at the depth their subject needs (docs/tree.md), no longer all at one depth.
    # Every topic and theme is in both indexes, and nothing else is but the aliases of merged
    # topics' parts, exactly those their topics list.
    nodes = [r for r in recs.values() if r.kind != "root"]
    aliases = {alias_id(r.id, p) for r in recs.values() for p in r.meta.aliases}
    assert all(recs[alias_owner(a)].kind == "topic" for a in aliases), "only leaves have parts"
    assert all(set(r.meta.part_text) <= set(r.meta.aliases) for r in recs.values())
    indexed = {i for i, _ in store.vector_search(uid, "topic", nodes[0].centroid(), len(nodes) + len(aliases) + 50)}
    assert {i for i in indexed if is_alias(i)} == aliases, "alias entries differ from the parts listed"
    assert indexed - aliases <= {r.id for r in nodes}, "a removed topic is still in the vector index"
    assert set(store.get_vectors(uid, "topic", [r.id for r in nodes])) == {r.id for r in nodes}
    for r in nodes:
        top = [i for i, _ in store.vector_search(uid, "topic", r.centroid(), 4)]
        assert r.id in top, f"topic {r.id} not found by its own centroid"
        words = terms(r.title) or list(r.keywords)
        assert r.id in {i for i, _ in store.text_search(uid, "topic", words, 100_000)}, f"{r.id} not in text index"
    return {"topics": sum(r.kind == "topic" for r in nodes), "themes": sum(r.kind == "theme" for r in nodes)}
