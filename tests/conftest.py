"""Shared fixtures: real SQLite files in tmp dirs, the deterministic HashEmbedder, (once per
session) the bundled MiniLM model, and a real PostgreSQL 18 + pgvector server: ``pg_url`` for
the session, ``pg_database`` a fresh database per test (tests/support/postgres.py). They are
registered here only, so every directory shares the one server."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from arbormem import Memory
from arbormem.embed.testing import HashEmbedder
from tests.support.postgres import pg_database, pg_url  # noqa: F401  (fixtures)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "memory.db"


@pytest.fixture
def mem(db_path: Path):
    m = Memory(db_path, embedder=HashEmbedder())
    yield m
    m.close()


@pytest.fixture(scope="session")
def minilm():
    from arbormem.embed.local import LocalEmbedder

    emb = LocalEmbedder()
    emb.embed(["warm up"])
    return emb


@pytest.fixture(scope="session")
def demo_data() -> dict:
    return json.loads(resources.files("arbormem").joinpath("data/demo.json").read_text("utf-8"))


def chat(user: str, assistant: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that loads the bundled model (through the ``minilm`` fixture) carries the
    ``model`` marker, so ``-m "not model"`` deselects them where the model is not installed
    instead of letting them error."""
    for item in items:
        if "minilm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.model)
