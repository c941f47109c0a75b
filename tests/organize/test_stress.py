"""TRACE's stress cases after consolidation: a needle in 200 exchanges, a memory overwrite
(with the bundled MiniLM, where the supersession threshold is calibrated) and gradual drift
across 10 branches (merges must not chain everything into one topic)."""

from __future__ import annotations

from pathlib import Path

from arbormem import Memory
from arbormem.embed.testing import HashEmbedder
from arbormem.store.state import ExchangeMarks
from tests.conftest import chat

from .conftest import T0, check_tree, fragmented

NEEDLE = "The wifi password at the lake cabin is blue-heron-42."


def test_needle_in_200_exchanges_survives_consolidation(db_path: Path) -> None:
    mem = Memory(db_path, embedder=HashEmbedder())
    items = fragmented(200)
    items[77] = {"messages": chat(NEEDLE, "Saved the cabin wifi password."), "session_id": "cabin",
                 "at": items[77]["at"]}
    mem.add_many(items, user_id="u")
    needle = mem.exchanges(user_id="u")[77]
    for _ in range(3):
        mem.consolidate("u")
    check_tree(mem, "u")
    assert mem.search("cabin wifi password", user_id="u", limit=1)[0].exchange.id == needle.id
    r = mem.recall("What's the wifi password at the lake cabin?", user_id="u", max_tokens=256, recent=0)
    assert NEEDLE in r.text and r.tokens <= 256
    assert mem.get(needle.id).topic_id in {t.id for t in mem.topics(user_id="u")}
    mem.close()


def test_memory_overwrite_with_minilm(tmp_path: Path, minilm) -> None:
    mem = Memory(tmp_path / "m.db", embedder=minilm)
    mem.add_many([
        {"messages": chat("My daughter Sarah is allergic to nuts, so no nuts at her party.",
                          "Understood, I'll keep Sarah's party nut-free."), "at": T0},
        {"messages": chat("Can you suggest a cake for the party?", "A lemon sponge is a classic."), "at": T0},
        {"messages": chat("I've started training for a half marathon.", "Great, build up slowly."),
         "at": T0.replace(month=3)},
        {"messages": chat("Actually, Sarah can eat nuts now, the allergist cleared her.",
                          "Wonderful news about Sarah."), "at": T0.replace(month=5)},
    ], user_id="u")
    report = mem.consolidate("u")
    exs = mem.exchanges(user_id="u")
    assert report.superseded == 1 and ExchangeMarks.of(exs[0].metadata).superseded_by == exs[3].id
    assert ExchangeMarks.of(exs[1].metadata).superseded_by is None
    assert ExchangeMarks.of(exs[2].metadata).superseded_by is None
    r = mem.recall("Can Sarah have nuts?", user_id="u", max_tokens=300, recent=0)
    assert "(update)" in r.text and "(superseded)" in r.text
    assert r.text.index("(update)") > r.text.index("(superseded)")  # time order, both present
    mem.close()


def _drift(n_sessions: int = 10, per_session: int = 10) -> tuple[list[dict], list[set[str]]]:
    vocab = [f"w{i:02d}" for i in range(3 * n_sessions + 6)]
    words = []
    items = []
    for s in range(n_sessions):
        window = vocab[3 * s: 3 * s + 6]  # half shared with the next session, none with s+2
        words.append(set(window))
        for i in range(per_session):
            k = s * per_session + i
            u = " ".join(window[(i + j) % 6] for j in range(5))
            a = " ".join(window[(i + 2 * j) % 6] for j in range(5))
            items.append({"messages": chat(f"{u} ({k})", a), "session_id": f"s{s}", "at": T0.replace(day=1 + s)})
    return items, words


def test_gradual_drift_across_10_branches_does_not_collapse(db_path: Path) -> None:
    mem = Memory(db_path, embedder=HashEmbedder())
    items, _ = _drift()
    mem.add_many(items, user_id="u")
    for _ in range(4):
        mem.consolidate("u")
    check_tree(mem, "u")
    sessions: dict[str, set[int]] = {}
    for e in mem.exchanges(user_id="u"):
        sessions.setdefault(e.topic_id, set()).add(int(e.session_id[1:]))
    # Sessions two apart share no vocabulary: no topic may hold both (no chained merges).
    for topic, ss in sessions.items():
        assert max(ss) - min(ss) <= 1, f"topic {topic} chains sessions {sorted(ss)}"
    assert len(sessions) >= 5
    mem.close()
