"""Store-level scale check: how search latency grows with one user's partition size.

    .venv/bin/python tests/support/pg_scale.py --sizes 10000,100000 --backend postgres sqlite

For each size and backend: load N exchanges of one user (synthetic chat texts from the bench
generator, clustered synthetic unit vectors of ``--dim`` dimensions) plus 20 small users, then
time ``vector_search`` (k=50) and ``text_search`` (k=50, the core's query terms) over
``--queries`` queries, and measure recall@10 of vector search against exact search.
PostgreSQL runs on a throw-away embedded server (tests/support/postgres.py). Prints one JSON
line per (backend, size).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arbormem.eval.bench import synthetic_items  # noqa: E402
from arbormem.models import Exchange  # noqa: E402
from arbormem.store.base import Store  # noqa: E402
from arbormem.text import terms  # noqa: E402
from support.postgres import EmbeddedPostgres, create_database  # noqa: E402


def _ex(user: str, seq: int, text: str) -> Exchange:
    return Exchange(
        id=f"{user}-{seq}", user_id=user, session_id=None, seq=seq, status="completed",
        messages=({"role": "user", "content": text},), user_text=text, assistant_text="",
        user_at=datetime(2025, 1, 1, tzinfo=timezone.utc), assistant_at=None,
    )


def _bulk_load(store: Any, items: list[dict[str, Any]], vectors: Any) -> list[np.ndarray]:
    """PostgreSQL only: COPY the rows in, then let the first put_vectors build the HNSW index
    over all of them (PostgreSQL's bulk path: building once beats inserting one by one)."""
    from arbormem.store.postgres import _tsvector_literal, tokens

    kept: list[np.ndarray] = []
    total_len = 0
    with store._conn() as conn, conn.cursor() as cur:
        with cur.copy("COPY arbormem_exchanges (id, user_id, seq, status, messages, user_text, "
                      "assistant_text, user_at, metadata) FROM STDIN") as cp:
            for i, it in enumerate(items, start=1):
                text = it["messages"][0]["content"] + "\n" + it["messages"][1]["content"]
                cp.write_row((f"big-{i}", "big", i, "completed", json.dumps(it["messages"]), text, "",
                              datetime(2025, 1, 1, tzinfo=timezone.utc), "{}"))
        with cur.copy("COPY arbormem_text (kind, item_id, user_id, body, tsv, doclen) FROM STDIN") as cp:
            for i, it in enumerate(items, start=1):
                text = it["messages"][0]["content"] + "\n" + it["messages"][1]["content"]
                toks = tokens(text)
                total_len += len(toks)
                cp.write_row(("exchange", f"big-{i}", "big", text, _tsvector_literal(toks), len(toks)))
        conn.execute("INSERT INTO arbormem_text_stats VALUES ('big', 'exchange', %s, %s)", (len(items), total_len))
        conn.execute("INSERT INTO arbormem_users VALUES ('big', %s)", (len(items),))
        with cur.copy("COPY arbormem_vectors (kind, item_id, user_id, dim, embedding) FROM STDIN "
                      "WITH (FORMAT BINARY)") as cp:
            cp.set_types(["text", "text", "text", "int4", "vector"])
            for start in range(0, len(items), 10000):
                vec = vectors(min(10000, len(items) - start))
                kept.append(vec)
                for j, v in enumerate(vec, start=start + 1):
                    cp.write_row(("exchange", f"big-{j}", "big", vec.shape[1], v))
    last = vectors(1)
    store.put_vectors("big", "exchange", [f"big-{len(items)}"], last)  # builds the index
    kept[-1][-1] = last[0]
    return kept


def run(store: Store, size: int, dim: int, n_queries: int, seed: int = 1, bulk: bool = False) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    items, queries = synthetic_items(size)
    centres = rng.normal(size=(500, dim)).astype(np.float32)

    def vectors(n: int) -> np.ndarray:
        m = centres[rng.integers(0, 500, n)] + 0.5 * rng.normal(size=(n, dim)).astype(np.float32)
        return (m / np.linalg.norm(m, axis=1, keepdims=True)).astype(np.float32)

    t0 = time.perf_counter()
    kept: list[np.ndarray] = _bulk_load(store, items, vectors) if bulk else []
    for start in range(0, 0 if bulk else size, 1000):
        chunk = items[start : start + 1000]
        vec = vectors(len(chunk))
        kept.append(vec)
        with store.transaction("big"):
            for i, it in enumerate(chunk, start=start + 1):
                text = it["messages"][0]["content"] + "\n" + it["messages"][1]["content"]
                store.insert_exchange(_ex("big", i, text))
                store.put_text("big", "exchange", f"big-{i}", text)
            store.put_vectors("big", "exchange", [f"big-{i}" for i in range(start + 1, start + 1 + len(chunk))], vec)
    for u in range(20):
        with store.transaction(f"small{u}"):
            for i in range(1, 51):
                store.insert_exchange(_ex(f"small{u}", i, "small user text about pottery"))
            store.put_vectors(f"small{u}", "exchange", [f"small{u}-{i}" for i in range(1, 51)], vectors(50))
    if bulk:
        with store._conn() as conn:  # type: ignore[attr-defined]
            conn.execute("ANALYZE")
    load_s = time.perf_counter() - t0
    allv = np.concatenate(kept)
    vec_ms, text_ms, recall = [], [], []
    for qi in range(n_queries):
        q = vectors(1)[0]
        t1 = time.perf_counter()
        hits = store.vector_search("big", "exchange", q, 50)
        vec_ms.append((time.perf_counter() - t1) * 1000)
        exact = set(np.argsort(-(allv @ q))[:10].tolist())
        recall.append(len(exact & {int(h[0].split("-")[1]) - 1 for h in hits[:10]}) / 10)
        words = terms(queries[qi % len(queries)])
        t1 = time.perf_counter()
        store.text_search("big", "exchange", words, 50)
        text_ms.append((time.perf_counter() - t1) * 1000)

    def pct(a: list[float], p: int) -> float:
        return round(float(np.percentile(a, p)), 2)

    return {
        "size": size, "dim": dim, "load_s": round(load_s, 1), "bulk": bulk,
        "vector_ms_p50": pct(vec_ms, 50), "vector_ms_p95": pct(vec_ms, 95),
        "text_ms_p50": pct(text_ms, 50), "text_ms_p95": pct(text_ms, 95),
        "vector_recall_at_10": round(float(np.mean(recall)), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000", help="comma-separated partition sizes")
    ap.add_argument("--backend", nargs="+", default=["postgres", "sqlite"], choices=["postgres", "sqlite"])
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--bulk", action="store_true",
                    help="PostgreSQL: COPY the big partition in and build the HNSW index once")
    args = ap.parse_args()
    server = EmbeddedPostgres(options="-c maintenance_work_mem=2GB -c max_parallel_maintenance_workers=2") if "postgres" in args.backend else None
    url = server.start() if server else ""
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            for backend in args.backend:
                store: Store
                if backend == "postgres":
                    from arbormem.store.postgres import PostgresStore

                    store = PostgresStore(create_database(url), max_size=2)
                else:
                    from arbormem.store.sqlite import SQLiteStore

                    store = SQLiteStore(Path(tempfile.mkdtemp()) / "scale.db")
                try:
                    print(json.dumps({"backend": backend, **run(store, size, args.dim, args.queries,
                                                                   bulk=args.bulk and backend == "postgres")}), flush=True)
                finally:
                    store.close()
    finally:
        if server:
            server.stop()


if __name__ == "__main__":
    main()
