from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.postgres import pg_database, pg_url  # noqa: F401  (fixtures: a real PostgreSQL)

DATA = Path(__file__).parent / "data"
MINI = DATA / "locomo_mini.json"


@pytest.fixture
def mini_path() -> Path:
    return MINI
