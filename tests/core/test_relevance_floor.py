"""The relevance floor of recall and search (issue 18), with the hash embedder and an explicit
floor (its cosines are word overlaps: the bundled MiniLM's calibrated floor is tested in
tests/core/test_local_model.py and measured by `arbormem eval locomo`)."""

from __future__ import annotations

import pytest

from arbormem import Memory
from arbormem.config import Settings
from arbormem.embed.local import MINILM_RELEVANCE_FLOOR, LocalEmbedder
from arbormem.errors import ValidationError

NOTES = [
    ("Kafka interview notes: partitions, consumer groups and offsets", "Rebalancing is the hard part."),
    ("Rust error handling with the question mark operator", "Use thiserror for library errors."),
    ("The induction hob needs flat bottomed pans", "Cast iron works well."),
    ("The boiler code is 4471 for the service engineer", "Noted, boiler code 4471."),
    ("Planning Maya's birthday party with a dinosaur cake", "Indoors or outside?"),
]


@pytest.fixture
def mem() -> Memory:
    m = Memory(":memory:", embedder="hash")
    for i, (u, a) in enumerate(NOTES):
        m.add([{"role": "user", "content": u}, {"role": "assistant", "content": a}], user_id="u",
              session_id=f"s{i}")
    return m


def test_hash_embedder_is_uncalibrated_so_the_floor_is_off(mem: Memory) -> None:
    assert mem.embedder.relevance_floor is None
    r = mem.recall("zzzqqq", user_id="u", recent=0)
    assert r.trace.min_relevance == 0 and len(r.exchanges) == len(NOTES)  # budget filling, as before
    assert LocalEmbedder().relevance_floor == MINILM_RELEVANCE_FLOOR


def test_no_match_gives_recent_window_only_and_no_hits(mem: Memory) -> None:
    r = mem.recall("zzzqqq", user_id="u", min_relevance=0.3, recent=1)
    assert [e.user_text for e in r.exchanges] == [NOTES[-1][0]]  # the recent window, nothing more
    assert r.trace.stopped.startswith("relevance floor: no exchange reached")
    assert r.trace.min_relevance == 0.3
    assert mem.search("zzzqqq", user_id="u", min_relevance=0.3) == []
    assert mem.recall("zzzqqq", user_id="u", min_relevance=0.3, recent=0).exchanges == ()


def test_relevant_exchange_comes_alone(mem: Memory) -> None:
    r = mem.recall("boiler code", user_id="u", min_relevance=0.3, recent=0, max_tokens=2048)
    texts = [e.user_text for e in r.exchanges]
    assert NOTES[3][0] in texts and len(texts) < len(NOTES)
    assert r.trace.best_relevance >= 0.3 and r.trace.below_floor > 0
    assert "packed" in r.trace.stopped
    hits = mem.search("boiler code", user_id="u", min_relevance=0.3)
    assert hits and hits[0].exchange.user_text == NOTES[3][0] and hits[0].relevance >= 0.3


def test_zero_restores_budget_filling(mem: Memory) -> None:
    r = mem.recall("boiler code", user_id="u", min_relevance=0, recent=0, max_tokens=2048)
    assert len(r.exchanges) == len(NOTES) and r.trace.min_relevance == 0
    assert len(mem.search("zzzqqq", user_id="u", min_relevance=0)) == len(NOTES)


def test_setting_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARBORMEM_RECALL__MIN_RELEVANCE", "0.3")
    m = Memory(":memory:", embedder="hash", settings=Settings())
    m.add([{"role": "user", "content": NOTES[0][0]}, {"role": "assistant", "content": NOTES[0][1]}], user_id="u")
    assert m.search("zzzqqq", user_id="u") == []
    assert m.recall("zzzqqq", user_id="u", recent=0).trace.min_relevance == 0.3
    assert m.search("zzzqqq", user_id="u", min_relevance=0)  # the argument wins


@pytest.mark.parametrize("bad", [-0.1, float("nan"), "0.5", True])
def test_bad_floor_is_refused(mem: Memory, bad: object) -> None:
    with pytest.raises(ValidationError):
        mem.recall("boiler", user_id="u", min_relevance=bad)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        mem.search("boiler", user_id="u", min_relevance=bad)  # type: ignore[arg-type]


def test_filters_on_recall_and_search(mem: Memory) -> None:
    assert {h.exchange.session_id for h in mem.search("boiler code", user_id="u", session_id="s1",
                                                      min_relevance=0)} == {"s1"}
    r = mem.recall("boiler code", user_id="u", session_id="s3", recent=2)
    assert {e.session_id for e in r.exchanges} == {"s3"}  # the recent window is filtered too
    none = mem.recall("boiler code", user_id="u", session_id="nope")
    assert none.exchanges == () and none.text == ""
    assert mem.search("boiler code", user_id="u", metadata={"x": 1}) == []
    with pytest.raises(ValidationError):
        mem.search("boiler", user_id="u", metadata={"x": [1]})
    with pytest.raises(ValidationError):
        mem.search("boiler", user_id="u", since="2026-01-02", until="2026-01-01")


def test_async_takes_the_same_filters(mem: Memory) -> None:
    import asyncio

    from arbormem import AsyncMemory

    async def run() -> tuple[list[str], list[str]]:
        amem = AsyncMemory(memory=mem)
        hits = await amem.search("boiler code", user_id="u", session_id="s3", min_relevance=0)
        r = await amem.recall("zzzqqq", user_id="u", min_relevance=0.3, recent=0)
        return [h.exchange.id for h in hits], [e.id for e in r.exchanges]

    hits, packed = asyncio.run(run())
    assert hits == [h.exchange.id for h in mem.search("boiler code", user_id="u", session_id="s3", min_relevance=0)]
    assert packed == []
