from __future__ import annotations

from pathlib import Path

from arbormem.eval.bench import BenchConfig, locomo_items, run_bench, synthetic_items


def test_synthetic_workload_is_deterministic_and_chat_shaped() -> None:
    a, qa = synthetic_items(50, seed=3)
    b, qb = synthetic_items(50, seed=3)
    assert a == b and qa == qb
    assert len(a) == 50
    assert len({it["messages"][0]["content"] for it in a}) == 50  # every text differs
    assert all([m["role"] for m in it["messages"]] == ["user", "assistant"] for it in a)
    assert [it["at"] for it in a] == sorted(it["at"] for it in a)


def test_locomo_workload_repeats_with_later_dates(mini_path: Path) -> None:
    items, queries = locomo_items([str(mini_path)], 20)  # 8 units in the file: 3 passes
    assert len(items) == 20
    assert items[0]["messages"] == items[8]["messages"]
    assert items[8]["at"] > items[7]["at"]
    assert len({it["session_id"] for it in items}) > 3
    assert "What class did Priya sign up for?" in queries


def test_bench_in_a_fresh_process_measures_everything(tmp_path: Path) -> None:
    cfg = BenchConfig(size=40, embedder="hash", queries=8, one_by_one=4, progress=False,
                      db_dir=str(tmp_path))
    rep = run_bench([cfg], isolate=True)
    (r,) = rep.results
    assert r.size == 40 and r.embedder == "hash-256"
    assert r.raw_embed_texts == 40
    assert r.bulk_per_s > 0 and r.one_by_one_per_s > 0 and r.raw_embed_per_s > 0
    assert r.background_per_s > 0 and r.background_ratio > 0 and r.singles_raw_per_s > 0
    assert r.recall_tokens_mean <= 1024
    assert r.disk_bytes > 0
    assert list(tmp_path.iterdir()) == []  # the temporary database is removed


def test_raw_embedding_sample_is_spread_over_the_run() -> None:
    from arbormem.embed.testing import HashEmbedder
    from arbormem.eval.bench import bench_size

    cfg = BenchConfig(size=100, embedder="hash", chunk=10, raw_sample=30, queries=5,
                      one_by_one=0, progress=False)
    r = bench_size(cfg, HashEmbedder(64))
    assert r.raw_embed_texts == 30  # chunks 0, 4 and 8 of ten
    assert r.one_by_one_per_s == 0.0 and r.bytes_per_exchange > 0
    assert r.embedder == "hash-64"
