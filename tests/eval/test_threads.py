"""`arbormem bench-threads`: real encodes in fresh processes, idle and beside a busy core."""

from __future__ import annotations

import pytest

from arbormem.eval.threads import markdown, measure


@pytest.mark.slow
def test_thread_latency_is_measured_both_ways() -> None:
    rows = [measure(1, busy=False, n=5), measure(2, busy=True, n=5)]
    assert [(r.threads, r.other_core) for r in rows] == [(1, "idle"), (2, "busy")]
    assert all(0 < r.p50_ms <= r.p95_ms for r in rows)
    table = markdown(rows)
    assert table.count("\n") == 3 and "| 2 | busy |" in table
