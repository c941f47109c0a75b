from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
MINI = DATA / "locomo_mini.json"


@pytest.fixture
def mini_path() -> Path:
    return MINI
