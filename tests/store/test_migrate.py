"""``copy_store`` / ``arbormem migrate-store``: SQLite -> PostgreSQL -> SQLite, losslessly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from arbormem import Memory
from arbormem.errors import StateError
from arbormem.store.cli import migrate_store
from arbormem.store.migrate import copy_store, fingerprint
from arbormem.store.postgres import PostgresStore
from arbormem.store.sqlite import SQLiteStore

SUBJECTS = ["sourdough starter", "marathon training", "tax deadline", "kubernetes eviction",
            "Lena's birthday", "Portuguese verbs", "Café Müller in Zürich"]


def build_memory(path: Path) -> dict[str, list[str]]:
    """A small but complete memory: several users, pending/failed, deletions, change log."""
    made: dict[str, list[str]] = {}
    with Memory(path, embedder="hash:64") as mem:
        for u, user in enumerate(("alice", "bob")):
            ids = []
            for i in range(30):
                subject = SUBJECTS[(i // 4 + u) % len(SUBJECTS)]
                ex = mem.add(
                    [{"role": "system", "content": "be brief"},
                     {"role": "user", "content": f"{subject} question {i} 🎉"},
                     {"role": "assistant", "content": f"answer on {subject}", "extra": {"k": [i]}}],
                    user_id=user, session_id=f"s{i // 10}", metadata={"i": i, "src": "test"},
                    at=f"2026-01-{1 + i // 3:02d}T10:{i:02d}:00+02:00",
                )
                ids.append(ex.id)
            pending = mem.begin("still waiting for a reply", user_id=user)
            failed = mem.begin("this one fails", user_id=user)
            mem.fail(failed.id, "model timeout")
            mem.delete(ids[3])  # a change-log row and a gap in the sequence
            made[user] = [*ids, pending.id, failed.id]
    return made


def test_sqlite_to_postgres_and_back_is_lossless(tmp_path: Path, pg_database: str) -> None:
    made = build_memory(tmp_path / "a.db")
    src = SQLiteStore(tmp_path / "a.db")
    pg = PostgresStore(pg_database)
    back = SQLiteStore(tmp_path / "b.db")
    try:
        seen: list[str] = []
        there = copy_store(src, pg, batch=7, progress=lambda stage, d, t: seen.append(stage))
        assert there.ok, there.mismatches
        assert [u.user_id for u in there.users] == ["alice", "bob"]
        assert there.totals["exchanges"] == 2 * 31  # 30 + pending + failed - deleted
        assert there.totals["topics"] > 2 and there.totals["vectors"] > 60
        assert there.totals["text"] > 60 and there.totals["term_df"] > 10
        assert there.totals["changes"] >= 2
        assert "embedder" in there.meta_keys
        assert any(s.endswith("exchanges") for s in seen)
        home = copy_store(pg, back)
        assert home.ok, home.mismatches
        for user in ("alice", "bob"):
            fp = fingerprint(src, user)
            assert fingerprint(pg, user) == fp
            assert fingerprint(back, user) == fp
            assert fp[0]["last_seq"] == 32
        assert pg.get_meta("embedder") == src.get_meta("embedder") == back.get_meta("embedder")
    finally:
        for s in (src, pg, back):
            s.close()

    # The copies behave as the original memory: same search results, sequence continues.
    with Memory(tmp_path / "a.db", embedder="hash:64") as a, \
            Memory(database_url=pg_database, embedder="hash:64") as p, \
            Memory(tmp_path / "b.db", embedder="hash:64") as b:
        for query in ("sourdough starter", "Zurich cafe", "tax"):
            want = [h.exchange.id for h in a.search(query, user_id="alice", limit=5)]
            assert want
            assert [h.exchange.id for h in b.search(query, user_id="alice", limit=5)] == want
            # PostgreSQL ranks lexical hits by its own BM25 (per-user statistics), so only
            # near-ties may order differently: the same exchanges must come back.
            got = [h.exchange.id for h in p.search(query, user_id="alice", limit=5)]
            assert len(set(got) & set(want)) >= 4
        assert a.get(made["bob"][0]) == p.get(made["bob"][0]) == b.get(made["bob"][0])
        assert p.add([{"role": "user", "content": "next"}], user_id="alice").seq == 33
        assert b.add([{"role": "user", "content": "next"}], user_id="alice").seq == 33


def test_copy_refuses_a_destination_holding_the_user(tmp_path: Path, pg_database: str) -> None:
    build_memory(tmp_path / "a.db")
    src, pg = SQLiteStore(tmp_path / "a.db"), PostgresStore(pg_database)
    try:
        assert copy_store(src, pg, users=["bob"]).ok
        assert pg.list_users() == ["bob"]
        with pytest.raises(StateError, match="bob"):
            copy_store(src, pg)
    finally:
        src.close()
        pg.close()


def test_migrate_store_command(tmp_path: Path, pg_database: str) -> None:
    build_memory(tmp_path / "a.db")
    runner = CliRunner()
    out = runner.invoke(migrate_store, ["--from", f"sqlite:///{tmp_path}/a.db", "--to", pg_database,
                                        "--json", "--quiet"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert report["ok"] is True and report["totals"]["exchanges"] == 62
    back = runner.invoke(migrate_store, ["--from", pg_database, "--to", str(tmp_path / "c.db"),
                                         "--user", "alice", "--quiet"])
    assert back.exit_code == 0, back.output
    assert "verified: counts and checksums match" in back.stdout
    again = runner.invoke(migrate_store, ["--from", pg_database, "--to", str(tmp_path / "c.db"),
                                          "--user", "alice", "--quiet"])
    assert again.exit_code == 1 and "already holds data" in again.stderr
    missing = runner.invoke(migrate_store, ["--from", str(tmp_path / "nope.db"), "--to", pg_database])
    assert missing.exit_code == 2 and "no SQLite memory" in missing.stderr
