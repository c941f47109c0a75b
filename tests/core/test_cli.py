"""The CLI over real files: demo, import (with line-numbered errors), tree/search/recall/stats."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from arbormem.cli import main


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "arbormem.cli", *args], capture_output=True, text=True, timeout=300)


def test_demo_offline_json() -> None:
    res = CliRunner().invoke(main, ["demo", "--embedder", "hash", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["recall"]["tokens"] <= 400 and out["full_transcript_tokens"] > out["recall"]["tokens"]
    assert out["tree"]["size"] == 25


def test_import_and_query_commands(tmp_path: Path) -> None:
    db = str(tmp_path / "m.db")
    data = tmp_path / "x.jsonl"
    data.write_text("\n".join(json.dumps({"messages": [
        {"role": "user", "content": f"my violin lesson number {i} went well"},
        {"role": "assistant", "content": "keep practising scales"}]}) for i in range(6)))
    r = CliRunner()
    res = r.invoke(main, ["import", str(data), "--db", db, "--user", "v", "--embedder", "hash", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == {"imported": 6, "skipped": 0, "user_id": "v", "skipped_items": []}
    again = r.invoke(main, ["import", str(data), "--db", db, "--user", "v", "--embedder", "hash", "--json"])
    assert again.exit_code == 0 and json.loads(again.output)["imported"] == 0  # idempotent
    assert json.loads(again.output)["skipped"] == 6
    res = r.invoke(main, ["search", "violin", "--db", db, "--user", "v", "--embedder", "hash", "--json"])
    assert res.exit_code == 0 and "violin" in json.loads(res.output)[0]["exchange"]["user_text"]
    res = r.invoke(main, ["recall", "violin lessons", "--db", db, "--user", "v", "--embedder", "hash",
                          "--max-tokens", "200", "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["tokens"] <= 200
    res = r.invoke(main, ["tree", "--db", db, "--user", "v", "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["size"] == 6
    res = r.invoke(main, ["stats", "--db", db, "--user", "v", "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["completed"] == 6


def test_malformed_import_reports_the_line_and_stores_nothing(tmp_path: Path) -> None:
    db = str(tmp_path / "m.db")
    bad = tmp_path / "bad.jsonl"
    good = json.dumps({"messages": [{"role": "user", "content": "fine"}]})
    bad.write_text(f"{good}\n{good}\n{{not json\n{good}\n")
    proc = run("import", str(bad), "--db", db, "--user", "u", "--embedder", "hash")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: line 3:")
    # The file was refused before the memory was opened: none was created.
    proc = run("stats", "--db", db, "--user", "u", "--json")
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: no SQLite memory at {db}"
    assert not Path(db).exists()
