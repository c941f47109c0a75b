"""Two arbormem versions' recalls paired query by query in one process, with the query embedding.

``recall_stages.py time`` runs one version per process, so on a shared machine the load moves
between the runs being compared (the same code read 2.15x and 2.52x in two runs a minute
apart). Here the arbormem on PYTHONPATH ("new") and another source tree ("base", imported as
the package ``arbormem_base`` from a copy) open the same persisted memory; for each query, one
query embedding is timed alone, then both recalls run in alternating order. Prints each
version's recall p50 over the embedding's p50, the per-query difference, and the stage p50s
(BENCHMARKS.md, "Recall stages")::

    git archive a04461d src | tar -x -C /tmp/base
    PYTHONPATH=src python scripts/recall_pair.py /tmp/base/src /tmp/syn10k.db --queries 200

The memory is built with ``recall_stages.py build``. ``--base-db`` gives the base its own copy
of the memory (the same rows: when the new version's schema is newer than the base accepts, the
new one opens the migrated copy and the base the original). Every module of arbormem imports its
siblings relatively, which is what lets the two copies live side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base_src", help="the other version's src folder (holding arbormem/)")
    ap.add_argument("db")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--base-db", help="the base's copy of the memory (default: db)")
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="recall_pair_")
    shutil.copytree(Path(a.base_src) / "arbormem", Path(tmp) / "arbormem_base")
    sys.path.insert(0, tmp)
    from arbormem_base.embed import make_embedder as base_embedder  # type: ignore[import-not-found]
    from arbormem_base.memory import Memory as BaseMemory  # type: ignore[import-not-found]

    from arbormem.embed import make_embedder
    from arbormem.memory import Memory

    queries = json.loads(Path(a.db + ".queries.json").read_text())[: a.queries]
    emb = make_embedder("local")
    mems = {"base": BaseMemory(a.base_db or a.db, embedder=base_embedder("local")), "new": Memory(a.db, embedder=emb)}
    for m in mems.values():
        m.recall(queries[0], user_id="bench", max_tokens=1024)  # model, token counter, caches
    load = os.getloadavg()[0]
    one: list[float] = []
    wall: dict[str, list[float]] = {k: [] for k in mems}
    stages: dict[str, dict[str, list[float]]] = {k: {} for k in mems}
    for j, q in enumerate(queries):
        t0 = time.perf_counter()
        emb.embed([q])
        one.append((time.perf_counter() - t0) * 1000)
        for side in ("base", "new") if j % 2 == 0 else ("new", "base"):
            t0 = time.perf_counter()
            r = mems[side].recall(q, user_id="bench", max_tokens=1024)
            wall[side].append((time.perf_counter() - t0) * 1000)
            for k, v in r.trace.timings_ms.items():
                stages[side].setdefault(k, []).append(v)
    for m in mems.values():
        m.close()
    shutil.rmtree(tmp, ignore_errors=True)

    e = float(np.median(one))
    diff = np.array(wall["new"]) - np.array(wall["base"])
    print(f"one query embedding p50 {e:.1f} ms; recall p50 base {np.median(wall['base']):.1f} ms = "
          f"{np.median(wall['base']) / e:.3f}x, new {np.median(wall['new']):.1f} ms = {np.median(wall['new']) / e:.3f}x; "
          f"new - base per query: median {np.median(diff):+.2f} ms")
    for side in mems:
        print(f"{side} stages p50 ms: " + ", ".join(f"{k} {np.median(v):.2f}" for k, v in stages[side].items()))
    print(f"load average {load:.1f} -> {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
