"""Crash safety of background placement: the crash test's child (``crash_child.py``) runs with
``ARBORMEM_PLACEMENT=background`` and is SIGKILLed at random moments, often with exchanges
whose ``complete`` returned still queued or a batch half-way through its placement. After
every kill: ``check`` passes before anything is placed (queued exchanges are counted, not
reported), nothing reported is lost, and after the first read every exchange is placed,
searchable in both indexes, and ``check`` passes with nothing queued.

Kill counts: ``ARBORMEM_CRASH_KILLS`` (default 8 here; the slow test runs 60).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from arbormem.check import check

from .conftest import open_memory
from .test_crash import _kill_once, _read_log


def _verify(db: Path, log: Path) -> tuple[int, int]:
    done, pending, _ = _read_log(log)
    with open_memory(db) as m:  # inline: a queue left by a crash is placed by any Memory
        before = check(m)
        assert before.ok, [str(p) for u in before.users for p in u.problems][:10]
        queued = sum(u.queued for u in before.users)
        missing = [i for i in done if m.store.get_exchange(i) is None]
        assert not missing, f"{len(missing)} reported exchanges lost: {missing[:5]}"
        for user in ("user0", "user1"):
            m.tree(user_id=user)  # the first read places what the crash left queued
        for ex_id, token in done.items():
            ex = m.get(ex_id)
            assert ex.status == "completed" and ex.topic_id is not None, ex_id
            if ex.archived:
                continue
            lexical = m.store.text_search(ex.user_id, "exchange", [token], 5)
            assert ex_id in {i for i, _ in lexical}, f"{ex_id} not in the full-text index"
            dense = m.store.vector_search(ex.user_id, "exchange", m.embedder.embed([ex.text])[0], 3)
            assert ex_id in {i for i, _ in dense}, f"{ex_id} not in the vector index"
        for ex_id in pending:
            ex = m.store.get_exchange(ex_id)
            assert ex is None or ex.status in ("pending", "completed")
        after = check(m)
        assert after.ok and sum(u.queued for u in after.users) == 0, [str(p) for u in after.users for p in u.problems][:10]
    return len(done), queued


def _run(tmp_path: Path, kills: int, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARBORMEM_PLACEMENT", "background")
    # Each embedder call of the child takes 40 ms (a model's pace), so kills find a queue.
    monkeypatch.setenv("ARBORMEM_CRASH_EMBED_DELAY", "0.04")
    db, log = tmp_path / "crash.db", tmp_path / "done.log"
    rng = random.Random(seed)
    reported = queued = 0
    for i in range(kills):
        _kill_once(db, log, seed * 10_000 + i, rng)
        reported, q = _verify(db, log)
        queued += q
    assert reported > kills, f"only {reported} exchanges reported in {kills} runs"
    print(f"crash (background placement): {kills} SIGKILLs, {reported} reported exchanges, "
          f"{queued} found queued after a kill, none lost, check clean")


def test_sigkill_with_background_placement(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _run(tmp_path, int(os.environ.get("ARBORMEM_CRASH_KILLS", "8")), 3, monkeypatch)


@pytest.mark.slow
def test_sigkill_with_background_placement_many(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _run(tmp_path, int(os.environ.get("ARBORMEM_CRASH_KILLS", "60")), 4, monkeypatch)
