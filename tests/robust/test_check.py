"""``arbormem check``: a clean memory passes; damaged derived data is found and repaired."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from click.testing import CliRunner

from arbormem.check import check
from arbormem.check_cli import check_command

from .conftest import open_memory, turn

SUBJECTS = ["sourdough starter feeding", "kernel scheduler latency", "alpine hiking routes",
            "tax return deadlines", "violin bow rosin"]


def _fill(path: Path, n: int = 60) -> list[str]:
    with open_memory(path) as m:
        ids = [m.add(turn(f"{SUBJECTS[i // 7 % 5]} question {i}", f"answer {i} about it"),
                     user_id="alice").id for i in range(n)]
        m.add(turn("bob's only note", "fine"), user_id="bob")
        p = m.begin("pending question", user_id="alice")
        f = m.begin("failed question", user_id="alice")
        m.fail(f.id, "no reply")
        assert p.status == "pending"
        m.delete(ids[5])
        m.delete(ids[n // 2])
    return ids


def test_clean_memory_passes(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    _fill(db)
    with open_memory(db) as m:
        report = check(m)
    assert report.ok, [str(p) for u in report.users for p in u.problems]
    assert {u.user_id for u in report.users} == {"alice", "bob"}
    alice = next(u for u in report.users if u.user_id == "alice")
    assert alice.completed == 58 and alice.exchanges == 60


def _damage(db: Path, ids: list[str]) -> None:
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("DELETE FROM vectors WHERE item_id = ?", (ids[1],))
        rid = conn.execute("SELECT rid FROM exchanges WHERE id = ?", (ids[2],)).fetchone()[0]
        conn.execute("DELETE FROM exchange_fts WHERE rowid = ?", (rid,))
        conn.execute("UPDATE topics SET size = size + 3 WHERE kind = 'topic' AND user_id = 'alice' "
                     "AND rid = (SELECT MIN(rid) FROM topics WHERE kind = 'topic' AND user_id = 'alice')")
        conn.execute("UPDATE exchanges SET topic_id = 't_nowhere' WHERE id = ?", (ids[3],))
    conn.close()


def test_damage_is_found_and_repaired(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    ids = _fill(db)
    _damage(db, ids)
    with open_memory(db) as m:
        before = check(m)
        kinds = {p.kind for u in before.users for p in u.problems}
        assert not before.ok and {"vector", "text", "tree"} <= kinds
        assert next(u for u in before.users if u.user_id == "bob").ok
        texts = {e.id: e.text for e in m.exchanges(user_id="alice")}
        fixed = check(m, repair=True)
        assert fixed.ok, [str(p) for u in fixed.users for p in u.problems]
        assert next(u for u in fixed.users if u.user_id == "alice").repaired
        # The transcript is untouched and every completed exchange is searchable again.
        assert {e.id: e.text for e in m.exchanges(user_id="alice")} == texts
        hits = m.search("question 2", user_id="alice", limit=50)
        assert ids[2] in {h.exchange.id for h in hits}
    with open_memory(db) as m:
        assert check(m).ok


def test_cli_exit_codes_and_json(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    ids = _fill(db, 20)
    runner = CliRunner()
    ok = runner.invoke(check_command, ["--db", str(db), "--json"])
    assert ok.exit_code == 0 and json.loads(ok.output)["ok"] is True
    _damage(db, ids)
    bad = runner.invoke(check_command, ["--db", str(db), "--user", "alice"])
    assert bad.exit_code == 1 and "check FAILED" in bad.output
    fixed = runner.invoke(check_command, ["--db", str(db), "--repair"])
    assert fixed.exit_code == 0, fixed.output
    missing = runner.invoke(check_command, ["--db", str(tmp_path / "none.db")])
    assert missing.exit_code == 2


def test_rows_that_break_reads_are_found(tmp_path: Path) -> None:
    """Issue 19: rows that made every read of their user fail while check said ok: NaN in
    metadata (SQLite's JSON functions refuse it), a time past year 9999 in UTC, unparseable
    messages, a scalar where the organiser's marks belong. Written with raw SQL, as an older
    version or a tool writing around the library could have."""
    db = tmp_path / "m.db"
    ids = _fill(db, 20)
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE exchanges SET metadata = '{\"score\": NaN}' WHERE id = ?", (ids[1],))
        conn.execute("UPDATE exchanges SET user_at = '9999-12-31T23:59:59-23:59' WHERE id = ?", (ids[2],))
        conn.execute("UPDATE exchanges SET messages = '[{\"role\": \"user\"' WHERE id = ?", (ids[3],))
        conn.execute("UPDATE exchanges SET metadata = '{\"_arbormem\": \"x\"}' WHERE id = ?", (ids[4],))
        conn.execute("UPDATE exchanges SET assistant_at = 'yesterday' WHERE id = ?", (ids[6],))
        conn.execute("UPDATE topics SET meta = 'not json' WHERE user_id = 'alice' AND kind = 'topic' "
                     "AND rid = (SELECT MIN(rid) FROM topics WHERE user_id = 'alice' AND kind = 'topic')")
    conn.close()
    with open_memory(db) as m:
        report = check(m)
        rows = [p for u in report.users for p in u.problems if p.kind == "row"]
        assert {p.item_id for p in rows} >= {ids[1], ids[2], ids[3], ids[4], ids[6]}, [str(p) for p in rows]
        assert any(p.message.startswith("topic meta") for p in rows)
        assert not report.ok and next(u for u in report.users if u.user_id == "bob").ok
        repaired = check(m, repair=True)  # refused for alice (her transcript is unreadable), no crash
        assert not repaired.ok and not next(u for u in repaired.users if u.user_id == "alice").repaired
    result = CliRunner().invoke(check_command, ["--db", str(db)])
    assert result.exit_code == 1 and "[row]" in result.output
