"""Eight writer processes on one PostgreSQL memory, through the public ``Memory`` API.

Each process adds exchanges for the same user (and for a user of its own) as fast as it can,
all starting together. Afterwards: every sequence number 1..N exactly once, every exchange in
a leaf of one consistent tree whose node sizes and centroid sums add up — a lost or
interleaved read-modify-write of the tree would break one of these sums.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from arbormem import Memory

PROCS = 8
PER_PROC = 12
SHARED = "team"

WORKER = r"""
import sys, time
from pathlib import Path
from arbormem import Memory

url, idx, n, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
subjects = ["sourdough starter feeding", "marathon training plan", "tax return deadline",
            "kubernetes pod eviction", "birthday party for Lena", "learning Portuguese verbs"]
with Memory(database_url=url, embedder="hash:64") as mem:
    deadline = time.monotonic() + 60
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    for j in range(n):
        subject = subjects[(idx + j // 3) % len(subjects)]
        text = f"writer {idx} note {j} about {subject}"
        if j % 4 == 3:  # the two-step path too: begin (allocates seq) then complete (places)
            ex = mem.begin(text, user_id="team", session_id=f"s{idx}")
            mem.complete(ex.id, f"reply to {text}")
        else:
            mem.add([{"role": "user", "content": text},
                     {"role": "assistant", "content": f"reply about {subject}"}],
                    user_id="team", session_id=f"s{idx}")
        mem.add([{"role": "user", "content": f"private {j}"}], user_id=f"solo{idx}")
print("ok", idx)
"""


def _check_tree(mem: Memory, user: str) -> None:
    store = mem.store
    exchanges = store.list_exchanges(user)
    nodes = {t.id: t for t in store.list_topics(user)}
    roots = [t for t in nodes.values() if t.kind == "root"]
    assert len(roots) == 1, "exactly one root per user"
    root = roots[0]
    kids: dict[str, list[str]] = {}
    for t in nodes.values():
        if t.kind != "root":
            assert t.parent_id in nodes, f"{t.id} has a dangling parent"
            kids.setdefault(str(t.parent_id), []).append(t.id)
    # every node reachable from the root exactly once (no cycles, no orphans)
    seen: set[str] = set()
    stack = [root.id]
    while stack:
        nid = stack.pop()
        assert nid not in seen
        seen.add(nid)
        stack.extend(kids.get(nid, []))
    assert seen == set(nodes)
    per_leaf: dict[str, int] = {}
    for e in exchanges:
        assert e.status == "completed"
        assert e.topic_id in nodes and nodes[e.topic_id].kind == "topic", "exchange not in a leaf"
        per_leaf[e.topic_id] = per_leaf.get(e.topic_id, 0) + 1
    for t in nodes.values():
        if t.kind == "topic":
            assert t.size == per_leaf.get(t.id, 0), f"leaf {t.id} size"
        else:
            assert t.size == sum(nodes[k].size for k in kids.get(t.id, [])), f"node {t.id} size"
    assert root.size == len(exchanges)
    vecs = store.get_vectors(user, "exchange", [e.id for e in exchanges])
    assert len(vecs) == len(exchanges)
    assert root.vec_sum is not None
    np.testing.assert_allclose(root.vec_sum, np.sum(list(vecs.values()), axis=0), atol=1e-3)


@pytest.mark.timeout(300)
def test_eight_writer_processes_keep_sequence_and_tree_consistent(
    pg_database: str, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, pg_database, str(i), str(PER_PROC), str(go)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i in range(PROCS)
    ]
    time.sleep(0.5)
    go.touch()
    results = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err[-3000:]
        assert out.startswith("ok")

    with Memory(database_url=pg_database, embedder="hash:64") as mem:
        total = PROCS * PER_PROC
        shared = mem.store.list_exchanges(SHARED)
        assert [e.seq for e in shared] == list(range(1, total + 1))  # none lost, none twice
        assert len({e.id for e in shared}) == total
        writers = {e.user_text.split()[1] for e in shared}
        assert writers == {str(i) for i in range(PROCS)}
        _check_tree(mem, SHARED)
        for i in range(PROCS):
            solo = mem.store.list_exchanges(f"solo{i}")
            assert [e.seq for e in solo] == list(range(1, PER_PROC + 1))
            _check_tree(mem, f"solo{i}")
        assert mem.store.list_users() == sorted([SHARED, *(f"solo{i}" for i in range(PROCS))])
        hits = mem.search("sourdough starter", user_id=SHARED, limit=5)
        assert hits and "sourdough" in hits[0].exchange.text


def test_async_memory_over_postgres_runs_concurrent_tasks(pg_database: str) -> None:
    """AsyncMemory offloads each call to a thread; on PostgreSQL each thread takes its own
    pooled connection, so concurrent tasks of one user still serialise on the user's lock."""
    import asyncio

    from arbormem import AsyncMemory

    async def main() -> list[int]:
        async with AsyncMemory(database_url=pg_database, embedder="hash:64") as mem:
            made = await asyncio.gather(*(
                mem.add([{"role": "user", "content": f"async note {i} about rowing"}], user_id="a")
                for i in range(24)
            ))
            hits = await mem.search("rowing", user_id="a", limit=3)
            assert hits
            return sorted(e.seq for e in made)

    assert asyncio.run(main()) == list(range(1, 25))
    with Memory(database_url=pg_database, embedder="hash:64") as mem:
        _check_tree(mem, "a")
