"""Sampled quality check of the embedded store's approximate search (``store/ann.py``).

    .venv/bin/python tests/support/ann_check.py --size 1000000 --dim 384 --queries 200

Builds an ``AnnMirror`` over ``--size`` clustered synthetic unit vectors, then for sampled
queries (other members of the same clusters, as queries resemble stored texts) compares the
top-10 with exact search: recall@10, and the query latency of both. Prints one JSON line.

With ``--store DB`` the same vectors go through a real ``SQLiteStore`` file instead (default
``ann_threshold``): put in batches, the first search starts the background build, then the
store's answers are compared with a second, exact store (``ann_threshold=None``) on the file,
and the store is reopened to time loading and checking the saved graph.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from arbormem.store.ann import AnnMirror


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--centres", type=int, default=2000)
    ap.add_argument("--connectivity", type=int, default=None, help="HNSW M (default: AnnMirror's)")
    ap.add_argument("--expansion-add", type=int, default=None, help="ef_construction")
    ap.add_argument("--dtype", default="i8", help="graph scalar type: i8, f16 or f32")
    ap.add_argument("--save", default=None, metavar="DIR",
                    help="also time saving the graph there, and loading + checking it")
    ap.add_argument("--store", default=None, metavar="DB",
                    help="go through a SQLiteStore at this (new) path instead of a bare mirror")
    ap.add_argument("--sweep", default="64:4,128:8,256:16,512:32",
                    help="ef_search:oversample pairs to measure on the same graph")
    args = ap.parse_args()
    graph_args = {k: v for k, v in (("connectivity", args.connectivity),
                                    ("expansion_add", args.expansion_add)) if v is not None}
    rng = np.random.default_rng(5)
    centres = rng.normal(size=(args.centres, args.dim)).astype(np.float32)

    def draw(n: int) -> np.ndarray:
        out = np.empty((n, args.dim), dtype=np.float32)
        for s in range(0, n, 100_000):
            m = min(100_000, n - s)
            v = centres[rng.integers(0, args.centres, m)] + 0.6 * rng.normal(size=(m, args.dim)).astype(np.float32)
            out[s : s + m] = v / np.linalg.norm(v, axis=1, keepdims=True)
        return out

    data = draw(args.size)
    queries = draw(args.queries)
    if args.store:
        store_check(Path(args.store), data, queries)
        return

    class Cache:  # stands in for SQLiteStore's vector cache
        pass

    t0 = time.perf_counter()
    mirror = AnnMirror(args.dim, dtype=args.dtype, **graph_args)
    mirror.sync(Cache(), np.arange(1, len(data) + 1), data, len(data))  # keys: rowids
    build_s = time.perf_counter() - t0
    persist: dict[str, float] = {}
    if args.save:
        path, mark = Path(args.save) / "check.usearch", {"user": "check", "kind": "exchange"}
        t = time.perf_counter()
        mirror.save(path, mark)
        persist["save_s"] = round(time.perf_counter() - t, 1)
        t = time.perf_counter()
        again = AnnMirror(args.dim, dtype=args.dtype, **graph_args)
        assert again.load(path, mark)
        again.sync(Cache(), np.arange(1, len(data) + 1), data, len(data))  # checks every vector
        persist["load_and_check_s"] = round(time.perf_counter() - t, 1)
        assert again.rebuilds == 0 and again.repaired == 0
        persist["file_mb"] = round(path.stat().st_size / 2**20)
        del again
    exact_ms: list[float] = []
    truth: list[set[int]] = []
    tenth: list[float] = []
    for q in queries:
        t = time.perf_counter()
        scores = np.einsum("ij,j->i", data, q)  # as SQLiteStore's exact path
        top = np.argpartition(-scores, 10)[:10]
        exact_ms.append((time.perf_counter() - t) * 1000)
        truth.append(set(top.tolist()))
        tenth.append(float(scores[top].min()))
    # The same graph searched with more effort: ef_search and exact re-rank oversampling.
    sweep = [tuple(int(x) for x in pair.split(":")) for pair in args.sweep.split(",")]
    for ef, over in sweep:
        mirror.index.expansion_search = ef
        mirror.oversample = over
        ann_ms, recall, as_good, gap = [], [], [], []
        for q, best, floor in zip(queries, truth, tenth, strict=True):
            t = time.perf_counter()
            hits = mirror.search(q, 10)
            ann_ms.append((time.perf_counter() - t) * 1000)
            recall.append(len({r for r, _ in hits} & best) / 10)
            # near-ties: a different neighbour as similar as the exact 10th is as good
            as_good.append(float(np.mean([s >= floor - 1e-6 for _, s in hits])))
            gap.append(floor - hits[-1][1])
        print(json.dumps({
            "size": args.size, "dim": args.dim, "build_s": round(build_s, 1),
            "dtype": args.dtype, "connectivity": mirror.index.connectivity,
            "expansion_add": mirror.index.expansion_add,
            "ef_search": ef, "oversample": over,
            "recall_at_10": round(float(np.mean(recall)), 4),
            "as_good_at_10": round(float(np.mean(as_good)), 4),
            "tenth_cosine_gap": round(float(np.mean(gap)), 5),
            "ann_ms_p50": round(float(np.percentile(ann_ms, 50)), 3),
            "ann_ms_p95": round(float(np.percentile(ann_ms, 95)), 3),
            "exact_ms_p50": round(float(np.percentile(exact_ms, 50)), 2),
            "exact_ms_p95": round(float(np.percentile(exact_ms, 95)), 2),
            **persist,
        }), flush=True)

def store_check(db: Path, data: np.ndarray, queries: np.ndarray) -> None:
    from arbormem.store.sqlite import SQLiteStore

    if db.exists():
        raise SystemExit(f"{db} exists: give a new path")
    store = SQLiteStore(db)
    t = time.perf_counter()
    for s in range(0, len(data), 10_000):
        store.put_vectors("check", "exchange", [f"x{i}" for i in range(s, min(len(data), s + 10_000))],
                          data[s : s + 10_000])
    put_s = time.perf_counter() - t

    def ready(st: SQLiteStore) -> float:
        """Seconds from the first search until the background graph work is done."""
        t = time.perf_counter()
        st.vector_search("check", "exchange", queries[0], 10)
        while any(slot.building for slot in list(st._ann.values())):
            time.sleep(0.05)
        return time.perf_counter() - t

    build_s = ready(store)
    exact = SQLiteStore(db, ann_threshold=None)
    recall, ann_ms, exact_ms = [], [], []
    for q in queries:
        t = time.perf_counter()
        hits = store.vector_search("check", "exchange", q, 10)
        ann_ms.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        truth = exact.vector_search("check", "exchange", q, 10)
        exact_ms.append((time.perf_counter() - t) * 1000)
        recall.append(len({i for i, _ in hits} & {i for i, _ in truth}) / 10)
    graph = store._ann[("check", "exchange")].mirror
    assert graph.n == len(data), "the store did not search through the graph"
    store.close()
    exact.close()
    reopened = SQLiteStore(db)
    load_s = ready(reopened)
    again = reopened._ann[("check", "exchange")].mirror
    assert again.rebuilds == 0, "the saved graph was not reused"
    reopened.close()
    print(json.dumps({
        "size": len(data), "dim": data.shape[1], "via": "SQLiteStore", "put_s": round(put_s, 1),
        "build_s": round(build_s, 1), "reopen_load_and_check_s": round(load_s, 1),
        "recall_at_10": round(float(np.mean(recall)), 4),
        "ann_ms_p50": round(float(np.percentile(ann_ms, 50)), 3),
        "ann_ms_p95": round(float(np.percentile(ann_ms, 95)), 3),
        "exact_ms_p50": round(float(np.percentile(exact_ms, 50)), 2),
        "exact_ms_p95": round(float(np.percentile(exact_ms, 95)), 2),
    }), flush=True)


if __name__ == "__main__":
    main()
