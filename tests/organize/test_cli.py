"""``arbormem consolidate`` and ``arbormem bench-consolidate`` through click's runner."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from arbormem import Memory
from arbormem.cli import main
from arbormem.embed.testing import HashEmbedder

from .conftest import fragmented


def test_consolidate_command_shows_before_and_after(db_path: Path) -> None:
    mem = Memory(db_path, embedder=HashEmbedder())
    mem.add_many(fragmented(120), user_id="u")
    mem.close()
    res = CliRunner().invoke(main, ["consolidate", "--db", str(db_path), "--user", "u", "--embedder", "hash", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)[0]
    assert out["report"]["merged"] > 0
    assert out["after"]["topics"] == out["before"]["topics"] - out["report"]["merged"]
    res = CliRunner().invoke(main, ["consolidate", "--db", str(db_path), "--embedder", "hash", "--show-tree"])
    assert res.exit_code == 0 and "before:" in res.output and "after:" in res.output


def test_consolidate_command_errors_are_one_line(db_path: Path) -> None:
    Memory(db_path, embedder=HashEmbedder()).close()
    res = CliRunner().invoke(main, ["consolidate", "--db", str(db_path), "--user", " ", "--embedder", "hash"])
    assert res.exit_code == 2 and res.output.startswith("error:")


def test_bench_consolidate_small(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["bench-consolidate", "--size", "300", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["size"] == 300 and out["embedder"] == "hash" and out["consolidate_seconds"] >= 0
    assert out["after"]["exchanges"] == 300
