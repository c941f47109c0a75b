"""Recall's stages on a persisted memory, with one query embedding timed beside each recall.

Build a memory once (the bench's workloads through ``Memory.add_many``, MiniLM), then time
recalls on it with whichever arbormem is on PYTHONPATH, so two versions compare on the same
data in one session (BENCHMARKS.md, "Recall stages")::

    python scripts/recall_stages.py build synthetic 10000 /tmp/syn10k.db
    python scripts/recall_stages.py build locomo 10000 /tmp/loc10k.db ../shared/data/locomo/*.json
    PYTHONPATH=src python scripts/recall_stages.py time /tmp/syn10k.db --queries 200

``time`` prints recall p50 / p95 / p99 over one query embedding, the process CPU time per
recall and per embedding (steadier than wall time on a loaded machine), the p50 of each stage in
``Recall.trace.timings_ms`` (older versions report fewer stages: their ``fuse`` held what is
now ``fuse`` + ``expand``, their ``pack`` what is now ``pack`` + ``render``), the torch threads
and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import numpy as np


def build(workload: str, size: int, db: str, files: list[str]) -> None:
    from arbormem.embed import make_embedder
    from arbormem.eval.bench import locomo_items, synthetic_items
    from arbormem.memory import Memory

    items, queries = synthetic_items(size + 300, 7) if workload == "synthetic" else locomo_items(files, size + 300)
    mem = Memory(db, embedder=make_embedder("local"))
    t0 = time.perf_counter()
    for i in range(0, size, 500):
        mem.add_many(items[i : min(size, i + 500)], user_id="bench")
    mem.close()
    rng = random.Random(8)
    Path(db + ".queries.json").write_text(json.dumps([rng.choice(queries) for _ in range(1000)]))
    print(f"built {workload} {size:,} in {time.perf_counter() - t0:.0f} s")


def measure(db: str, n: int) -> None:
    import torch

    from arbormem.embed import make_embedder
    from arbormem.memory import Memory

    emb = make_embedder("local")
    mem = Memory(db, embedder=emb)
    queries = json.loads(Path(db + ".queries.json").read_text())[:n]
    mem.recall(queries[0], user_id="bench", max_tokens=1024)  # model, token counter, caches
    load = os.getloadavg()[0]
    one: list[float] = []
    rec: list[float] = []
    cpu = [0.0, 0.0]  # process CPU seconds (all threads): the embeddings, the recalls
    stages: dict[str, list[float]] = {}
    for q in queries:
        c0, t0 = time.process_time(), time.perf_counter()
        emb.embed([q])
        one.append((time.perf_counter() - t0) * 1000)
        c1, t0 = time.process_time(), time.perf_counter()
        r = mem.recall(q, user_id="bench", max_tokens=1024)
        rec.append((time.perf_counter() - t0) * 1000)
        cpu[0] += c1 - c0
        cpu[1] += time.process_time() - c1
        for k, v in r.trace.timings_ms.items():
            stages.setdefault(k, []).append(v)
    mem.close()

    def p(xs: list[float], q: float) -> float:
        return float(np.percentile(xs, q))

    print(f"one query embedding p50 {p(one, 50):.1f} ms; recall p50 / p95 / p99 {p(rec, 50):.1f} / "
          f"{p(rec, 95):.1f} / {p(rec, 99):.1f} ms = {p(rec, 50) / p(one, 50):.2f}x / "
          f"{p(rec, 95) / p(one, 95):.2f}x / {p(rec, 99) / p(one, 99):.2f}x one query embedding")
    # CPU time moves less than wall time with the neighbours' load on a shared machine: what a
    # recall costs beyond embedding its query is arbormem's own work.
    print(f"CPU ms per query: embedding {cpu[0] / len(queries) * 1000:.1f}, recall "
          f"{cpu[1] / len(queries) * 1000:.1f} (own work {(cpu[1] - cpu[0]) / len(queries) * 1000:.1f})")
    print("stages p50 ms: " + ", ".join(f"{k} {p(v, 50):.2f}" for k, v in stages.items()))
    print(f"torch threads {torch.get_num_threads()}; load average {load:.1f} -> {os.getloadavg()[0]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("workload", choices=("synthetic", "locomo"))
    b.add_argument("size", type=int)
    b.add_argument("db")
    b.add_argument("files", nargs="*")
    t = sub.add_parser("time")
    t.add_argument("db")
    t.add_argument("--queries", type=int, default=200)
    a = ap.parse_args()
    if a.cmd == "build":
        build(a.workload, a.size, a.db, a.files)
    else:
        measure(a.db, a.queries)


if __name__ == "__main__":
    main()
