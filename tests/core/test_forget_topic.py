"""Forgetting a topic or theme (``Memory.forget_topic``): explicit, exact, all or nothing.

A theme of several topics needs ``confirm=True``; the report names exactly the exchanges that
go, unrelated exchanges (of the same user and of others) stay, and every derived index stays
exact (``arbormem check``'s raw-SQL verification on SQLite; tree sums and indexes on
PostgreSQL)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from arbormem import (
    ConfirmationRequired,
    ForgetReport,
    Memory,
    NotFoundError,
    StateError,
    StoreError,
    Topic,
    ValidationError,
)
from arbormem.check import check
from arbormem.store.sqlite import SQLiteStore
from tests.conftest import chat

OTHER = [chat("Carol's secret: the vault code is 7431.", "I will keep it safe."),
         chat("Carol is learning the cello this autumn.", "The cello is wonderful.")]


def _load(mem: Memory, demo: dict[str, Any]) -> None:
    mem.add_many(demo["exchanges"], user_id="demo")
    for m in OTHER:
        mem.add(m, user_id="carol")


def _leaves(node: Topic) -> set[str]:
    return {t.id for t in node.walk() if t.kind == "topic"}


def _theme(mem: Memory, user: str = "demo") -> Topic:
    """A theme holding more than one topic (the case that needs confirmation)."""
    root = mem.tree(user_id=user)
    return next(t for t in root.walk() if t.kind == "theme" and len(_leaves(t)) > 1)


def _filed_under(mem: Memory, node: Topic, user: str = "demo") -> list[str]:
    """The ids of the exchanges filed under ``node``, read independently of forget_topic."""
    leaves = _leaves(node)
    return [e.id for e in mem.exchanges(user_id=user) if e.topic_id in leaves]


def _tree_is_exact(mem: Memory, user: str) -> None:
    """Store-independent invariants: sizes and centroid sums equal the filed exchanges."""
    root = mem.tree(user_id=user)
    exchanges = mem.exchanges(user_id=user, status="completed")
    vecs = mem.store.get_vectors(user, "exchange", [e.id for e in exchanges])
    assert set(vecs) == {e.id for e in exchanges}
    by_leaf: dict[str, list[str]] = {}
    for e in exchanges:
        by_leaf.setdefault(e.topic_id or "", []).append(e.id)
    assert set(by_leaf) == _leaves(root)  # no exchange without its leaf, no empty leaf
    recs = {r.id: r for r in mem.store.list_topics(user)}
    for t in root.walk():
        assert t.size == sum(len(by_leaf.get(leaf, [])) for leaf in _leaves(t)), t.id
        if t.kind == "topic":
            expected = np.sum([vecs[x] for x in by_leaf[t.id]], axis=0)
            vec_sum = recs[t.id].vec_sum
            assert vec_sum is not None and np.allclose(vec_sum, expected, atol=1e-4), t.id


def test_a_theme_needs_confirmation_and_exactly_its_exchanges_go(tmp_path: Path, demo_data: dict) -> None:
    with Memory(tmp_path / "m.db", embedder="hash") as mem:
        _load(mem, demo_data)
        theme = _theme(mem)
        doomed = _filed_under(mem, theme)
        everything = [e.id for e in mem.exchanges(user_id="demo")]
        kept = [x for x in everything if x not in doomed]
        assert doomed and kept
        subtree = {t.id for t in theme.walk()}

        with pytest.raises(ConfirmationRequired) as refused:
            mem.forget_topic(theme.id, user_id="demo")
        err = refused.value
        assert err.code == "confirmation_required" and err.http_status == 409
        assert isinstance(err, StateError)
        assert f"{len(doomed)} exchanges in {len(_leaves(theme))} topics" in str(err)
        assert list(err.report.exchange_ids) == doomed and err.report.applied is False
        assert [e.id for e in mem.exchanges(user_id="demo")] == everything  # nothing went

        preview = mem.forget_topic(theme.id, user_id="demo", dry_run=True)
        assert preview == err.report
        assert isinstance(preview, ForgetReport) and preview.kind == "theme" and preview.confirm_required
        assert preview.path == theme.path and preview.title == theme.title
        assert list(preview.exchange_ids) == doomed and preview.exchange_count == len(doomed)
        assert list(preview.seqs) == [mem.get(x).seq for x in doomed]
        assert preview.topic_count == len(_leaves(theme))
        assert subtree <= set(preview.removed_topic_ids)
        assert [e.id for e in mem.exchanges(user_id="demo")] == everything

        done = mem.forget_topic(theme.id, user_id="demo", confirm=True)
        assert done.applied and list(done.exchange_ids) == doomed
        assert done.removed_topic_ids == preview.removed_topic_ids  # the preview was exact
        assert [e.id for e in mem.exchanges(user_id="demo")] == kept
        assert len(mem.exchanges(user_id="carol")) == len(OTHER)
        for x in doomed:
            with pytest.raises(NotFoundError):
                mem.get(x)
        remaining = {t.id for t in mem.tree(user_id="demo").walk()}
        assert not remaining & set(done.removed_topic_ids)
        with pytest.raises(NotFoundError):
            mem.topic(theme.id, user_id="demo")

        # Every derived index is exact: the raw-SQL check of `arbormem check` finds nothing.
        report = check(mem)
        assert report.ok, [str(p) for u in report.users for p in u.problems]
        _tree_is_exact(mem, "demo")
        gone_text = mem.store.text_search("demo", "exchange", ["the"], 1000)
        assert not {i for i, _ in gone_text} & set(doomed)
        hits = mem.search("peanut allergy birthday party", user_id="demo", limit=50)
        assert not {h.exchange.id for h in hits} & set(doomed)

        logged = mem.history(theme.id, user_id="demo")
        assert logged[0].action == "forget_topic" and logged[0].detail["exchanges"] == doomed


def test_one_topic_goes_without_confirmation_and_its_theme_stays(tmp_path: Path, demo_data: dict) -> None:
    with Memory(tmp_path / "m.db", embedder="hash") as mem:
        _load(mem, demo_data)
        theme = _theme(mem)
        leaf = next(t for t in theme.walk() if t.kind == "topic")
        doomed = _filed_under(mem, leaf)
        others = [x for x in _filed_under(mem, theme) if x not in doomed]
        report = mem.forget_topic(leaf.id, user_id="demo")
        assert report.applied and not report.confirm_required and report.kind == "topic"
        assert list(report.exchange_ids) == doomed and report.topic_count == 1
        assert leaf.id in report.removed_topic_ids
        if len(theme.children) > 2:
            assert theme.id not in report.removed_topic_ids
            assert mem.topic(theme.id, user_id="demo").size == len(others)
        # (a theme left with one child is that child: it dissolves, its other child stays)
        assert [e.id for e in mem.exchanges(user_id="demo") if e.id in set(others)] == others
        assert check(mem).ok
        _tree_is_exact(mem, "demo")


def test_forget_topic_stays_in_the_users_partition_and_checks_its_arguments(
        tmp_path: Path, demo_data: dict) -> None:
    with Memory(tmp_path / "m.db", embedder="hash") as mem:
        _load(mem, demo_data)
        carol_topic = next(t.id for t in mem.topics(user_id="carol"))
        root_id = mem.tree(user_id="demo").id
        theme = _theme(mem)
        before = len(mem.exchanges(user_id="demo"))
        for bad in (carol_topic, root_id, "t_nope"):
            with pytest.raises(NotFoundError):
                mem.forget_topic(bad, user_id="demo", confirm=True)
        for not_an_id in (42, {"a": {}}):
            with pytest.raises(ValidationError):
                mem.forget_topic(not_an_id, user_id="demo", confirm=True)  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            mem.forget_topic(theme.id, user_id="demo", confirm="yes")  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            mem.forget_topic(theme.id, user_id="demo", confirm=True, expect_exchanges=-1)
        # The topic changed since the preview: refused, nothing deleted.
        with pytest.raises(StateError, match="preview it again") as changed:
            mem.forget_topic(theme.id, user_id="demo", confirm=True, expect_exchanges=theme.size + 1)
        assert not isinstance(changed.value, ConfirmationRequired)
        assert len(mem.exchanges(user_id="demo")) == before
        assert len(mem.exchanges(user_id="carol")) == len(OTHER)
        done = mem.forget_topic(theme.id, user_id="demo", confirm=True, expect_exchanges=theme.size)
        assert done.exchange_count == theme.size


class FailingStore(SQLiteStore):
    """A real SQLite store whose third exchange deletion fails (a disk error mid-way)."""

    deletions = 0

    def delete_exchange(self, exchange_id: str) -> None:
        type(self).deletions += 1
        if type(self).deletions == 3:
            raise StoreError("disk I/O error")
        super().delete_exchange(exchange_id)


def test_forgetting_is_all_or_nothing(tmp_path: Path, demo_data: dict) -> None:
    with Memory(store=FailingStore(tmp_path / "m.db"), embedder="hash") as mem:
        _load(mem, demo_data)
        _load(mem, demo_data)  # the conversation again: its subjects come home, nodes grow
        theme = next(t for t in mem.tree(user_id="demo").walk()
                     if t.kind != "root" and len(_filed_under(mem, t)) >= 3)
        everything = [e.id for e in mem.exchanges(user_id="demo")]
        topics = {t.id for t in mem.tree(user_id="demo").walk()}
        FailingStore.deletions = 0
        with pytest.raises(StoreError):
            mem.forget_topic(theme.id, user_id="demo", confirm=True)
        assert FailingStore.deletions == 3
        assert [e.id for e in mem.exchanges(user_id="demo")] == everything
        assert {t.id for t in mem.tree(user_id="demo").walk()} == topics
        assert check(mem).ok
        _tree_is_exact(mem, "demo")


def test_forget_topic_on_postgres(pg_database: str, demo_data: dict) -> None:
    with Memory(database_url=pg_database, embedder="hash") as mem:
        _load(mem, demo_data)
        theme = _theme(mem)
        doomed = _filed_under(mem, theme)
        kept = [e.id for e in mem.exchanges(user_id="demo") if e.id not in set(doomed)]
        with pytest.raises(ConfirmationRequired):
            mem.forget_topic(theme.id, user_id="demo")
        preview = mem.forget_topic(theme.id, user_id="demo", dry_run=True)
        done = mem.forget_topic(theme.id, user_id="demo", confirm=True)
        assert list(done.exchange_ids) == doomed and done.removed_topic_ids == preview.removed_topic_ids
        assert [e.id for e in mem.exchanges(user_id="demo")] == kept
        assert len(mem.exchanges(user_id="carol")) == len(OTHER)
        assert mem.store.get_vectors("demo", "exchange", doomed) == {}
        _tree_is_exact(mem, "demo")
        hits = mem.search("peanut allergy birthday party", user_id="demo", limit=50)
        assert not {h.exchange.id for h in hits} & set(doomed)


def test_cli_forget_previews_without_yes_and_deletes_with_it(tmp_path: Path, demo_data: dict) -> None:
    import json

    from click.testing import CliRunner

    from arbormem.cli import main

    db = tmp_path / "m.db"
    with Memory(db, embedder="hash") as mem:
        _load(mem, demo_data)
        theme = _theme(mem)
        doomed = _filed_under(mem, theme)
        everything = [e.id for e in mem.exchanges(user_id="demo")]
    r = CliRunner()
    args = ["forget", "--db", str(db), "--user", "demo", "--topic", theme.id]
    shown = r.invoke(main, args)
    assert shown.exit_code == 0, shown.output
    assert shown.output.startswith(f"would forget theme {' › '.join(theme.path)}")
    assert f"{len(doomed)} exchanges in {len(_leaves(theme))} topics" in shown.output
    assert all(x in shown.output for x in doomed) and "--yes" in shown.output
    as_json = json.loads(r.invoke(main, [*args, "--json"]).output)
    assert as_json["exchange_ids"] == doomed and as_json["applied"] is False
    with Memory(db, embedder="hash") as mem:
        assert [e.id for e in mem.exchanges(user_id="demo")] == everything

    done = r.invoke(main, [*args, "--yes", "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["exchange_ids"] == doomed and json.loads(done.output)["applied"] is True
    again = r.invoke(main, [*args, "--yes"])
    assert again.exit_code == 1 and again.output.strip() == f"error: no topic {theme.id!r}"
    missing = r.invoke(main, ["forget", "--db", str(tmp_path / "nope.db"), "--topic", "t_x"])
    assert missing.exit_code == 2 and len(missing.output.strip().splitlines()) == 1
    assert not (tmp_path / "nope.db").exists()
    with Memory(db, embedder="hash") as mem:
        assert [e.id for e in mem.exchanges(user_id="demo")] == [x for x in everything if x not in doomed]
        assert len(mem.exchanges(user_id="carol")) == len(OTHER)
