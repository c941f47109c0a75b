"""Shared fixtures: real SQLite files in tmp dirs, the deterministic HashEmbedder, and (once per
session) the bundled MiniLM model."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from arbormem import Memory
from arbormem.embed.testing import HashEmbedder


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
