"""The rendered context never exceeds the budget (checked with an independent count)."""

from __future__ import annotations

import bpe_openai
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arbormem import Memory
from arbormem.embed.testing import HashEmbedder
from tests.conftest import chat

_ENC = bpe_openai.get_encoding("cl100k_base")
_MEM: Memory | None = None


def _memory() -> Memory:
    global _MEM
    if _MEM is None:
        _MEM = Memory(":memory:", embedder=HashEmbedder())
        subjects = ["garden tomatoes", "python asyncio", "japan trip kyoto", "marathon training",
                    "piano lessons", "tax return", "sourdough bread", "dog walking"]
        items = []
        for i in range(160):
            s = subjects[i % len(subjects)]
            items.append({"messages": chat(f"Question {i} about {s}: details {i * 7} " + "word " * (i % 40),
                                           f"Answer about {s} with advice number {i}. " * (1 + i % 5)),
                          "session_id": f"s{i // 10}"})
        _MEM.add_many(items, user_id="u")
    return _MEM


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(budget=st.integers(min_value=0, max_value=3000),
       query=st.sampled_from(["tomatoes", "kyoto temples in autumn", "how is my marathon going?",
                              "sourdough starter", "x", "tax"]),
       recent=st.integers(min_value=0, max_value=4))
def test_budget_is_never_exceeded(budget: int, query: str, recent: int) -> None:
    r = _memory().recall(query, user_id="u", max_tokens=budget, recent=recent)
    assert r.tokens == len(_ENC.encode(r.text))
    assert r.tokens <= budget
    for ex in r.exchanges:  # everything listed is really in the text, verbatim
        assert ex.user_text in r.text and ex.assistant_text in r.text
    if budget >= 400:
        assert r.exchanges, "a roomy budget over a full memory should carry something"


def test_budget_zero_gives_empty_context() -> None:
    r = _memory().recall("tomatoes", user_id="u", max_tokens=0)
    assert r.text == "" and r.tokens == 0 and r.exchanges == ()
