"""The evaluation on the real LoCoMo development files (slow; needs the bundled model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from arbormem import Memory
from arbormem.eval.locomo import load_conversations
from arbormem.eval.runner import run_locomo

LOCOMO = Path(__file__).resolve().parents[3] / "shared" / "data" / "locomo"
FILES = sorted(LOCOMO.glob("*.json"))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.model,
    pytest.mark.skipif(not FILES, reason=f"LoCoMo files not found in {LOCOMO}"),
]


@pytest.fixture(scope="module")
def report():
    pytest.importorskip("sentence_transformers")
    convs = load_conversations(FILES)
    with Memory(":memory:", embedder="local") as mem:
        return run_locomo(mem, convs, budgets=[256, 512, 1024, 2048, 4096], files=[str(f) for f in FILES])


def test_real_files_run_clean(report) -> None:
    assert report.questions == sum(len(c.scored_questions()) for c in load_conversations(FILES))
    assert report.token_mismatches == 0
    for s in report.systems:
        for b in report.budgets:
            assert report.score(s, b).over_budget == 0, (s, b)


def test_baselines_are_sane(report) -> None:
    # Flat hybrid retrieval over exchanges must land near the README's turn-level reference
    # (0.71 at 1,024 tokens, 0.80 at 2,048); recency must be far below it.
    hybrid = report.score("hybrid", 1024).evidence_recall
    assert 0.6 <= hybrid <= 0.85
    assert report.score("recency", 1024).evidence_recall < 0.2
    assert report.score("hybrid", 2048).evidence_recall > hybrid


def test_issue_targets(report) -> None:
    # Issue 4's recall targets (0.870 / 0.930 on this split at b90b39d).
    assert report.score("arbormem", 1024).evidence_recall >= 0.80
    assert report.score("arbormem", 2048).evidence_recall >= 0.90


@pytest.mark.parametrize("budget", [256, 512, 1024, 2048])
def test_ten_point_lead(report, budget: int) -> None:
    # +16.3 / +17.7 / +16.3 / +11.9 over the best baseline at b90b39d.
    assert report.lead(budget) >= 0.10


@pytest.mark.xfail(reason="issue 4: the lead at 4,096 tokens is +8.1 on this split (10 points would need 0.979)",
                   strict=True)
def test_ten_point_lead_at_4096(report) -> None:
    assert report.lead(4096) >= 0.10
