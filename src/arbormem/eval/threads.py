"""Single-query embedding latency with 1 vs 2 torch threads, idle and with the other core busy.

On 2-core machines torch's OpenMP workers spin; with two threads a short encode can stall
when another process holds the second core. This measures it on the machine at hand, so the
``ARBORMEM_TORCH_THREADS`` default (1) stays a measured choice. Each setting runs in a fresh
process (torch's thread count is fixed at first use); "busy" runs a pure-Python spinner on
the side for the duration.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

_CHILD = r"""
import json, os, sys, time
from arbormem.embed.local import LocalEmbedder
emb = LocalEmbedder(threads=int(sys.argv[1]))
emb.embed(["warm up"])
qs = ["what did we decide about the trip to Kyoto?", "when is the tax return due?",
      "which snacks are safe for Leo?", "how is the marathon training going?"]
out = []
for i in range(int(sys.argv[2])):
    t = time.perf_counter(); emb.embed([qs[i % len(qs)]]); out.append((time.perf_counter() - t) * 1000)
print(json.dumps(out))
"""


@dataclass(frozen=True)
class ThreadLatency:
    threads: int
    other_core: str
    p50_ms: float
    p95_ms: float


def _spin(stop_at: float) -> None:  # keeps one core busy
    x = 0
    while time.time() < stop_at:
        x += 1


def measure(threads: int, busy: bool, n: int = 60) -> ThreadLatency:
    """p50/p95 of embedding one short query, in a fresh process."""
    spinner = None
    if busy:
        spinner = mp.get_context("spawn").Process(target=_spin, args=(time.time() + 600,), daemon=True)
        spinner.start()
    try:
        out = subprocess.run([sys.executable, "-c", _CHILD, str(threads), str(n)], capture_output=True,
                             text=True, check=True, timeout=600)
    finally:
        if spinner is not None:
            spinner.terminate()
            spinner.join()
    xs = sorted(json.loads(out.stdout.strip().splitlines()[-1]))
    return ThreadLatency(threads, "busy" if busy else "idle", round(statistics.median(xs), 2),
                         round(xs[int(0.95 * (len(xs) - 1))], 2))


def run_all(n: int = 60) -> list[ThreadLatency]:
    return [measure(t, b, n) for t in (1, 2) for b in (False, True)]


def markdown(rows: list[ThreadLatency]) -> str:
    lines = ["| torch threads | other core | one-query embed p50 ms | p95 ms |", "|---:|---|---:|---:|"]
    lines += [f"| {r.threads} | {r.other_core} | {r.p50_ms} | {r.p95_ms} |" for r in rows]
    return "\n".join(lines)
