"""The ranking stages score the candidate pool as arrays (retrieve/scoring.py, ``Ranking``):
pinned here against the former implementation, which walked dicts of candidates stage by
stage (kept below as the reference), on a real SQLite memory. What two stages find before
they score (``exact_hits``, ``feedback_scores``) is shared: the rewrite left it as it was.
Every candidate's score, relevance and sources, and the candidates' order, must be bit for
bit the same."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from arbormem import Memory
from arbormem.embed.testing import HashEmbedder
from arbormem.models import Exchange
from arbormem.retrieve import engine, scoring
from arbormem.retrieve.engine import _Clock
from arbormem.retrieve.reader import ExchangeReader, token_set
from arbormem.retrieve.scoring import Candidate, standardise
from arbormem.store.base import ExchangeFilter, ExchangeHead
from arbormem.text import index_tokens
from tests.conftest import chat

# -- the former dict-based stages (the reference) --------------------------------------------


@dataclass
class _RefRanking:
    reader: ExchangeReader
    fused: dict[str, float]
    sources: defaultdict[str, set[str]]
    floor: float
    coverage: dict[str, float] = field(default_factory=dict)

    @property
    def exchanges(self) -> dict[str, Exchange | ExchangeHead]:
        return self.reader.rows

    def order(self) -> list[str]:
        return _ref_ranked_ids(self.fused, self.reader.rows)


def _ref_ranked_ids(scores: Mapping[str, float], exchanges: Mapping[str, Exchange | ExchangeHead]) -> list[str]:
    keys = [(-s, ex.seq, i) for i, s in scores.items() if (ex := exchanges.get(i)) is not None]
    keys.sort()
    return [i for _, _, i in keys]


def _ref_rank_candidates(cands: Mapping[str, Candidate],
                         exchanges: Mapping[str, Exchange | ExchangeHead]) -> list[Candidate]:
    def seq(i: str) -> int:
        ex = exchanges.get(i)
        return ex.seq if ex is not None else 0
    order = sorted([(-c.score, seq(i), n) for n, (i, c) in enumerate(cands.items())])
    values = list(cands.values())
    return [values[n] for _, _, n in order]


def _ref_fuse(dense, lex, reader, w):  # type: ignore[no-untyped-def]
    dz, dfloor = standardise(dense)
    lz, lfloor = standardise([(i, s) for i, s in lex if s > 0])
    fused: dict[str, float] = {}
    sources: defaultdict[str, set[str]] = defaultdict(set)
    for i in dict.fromkeys([*dz, *lz]):
        fused[i] = dz.get(i, dfloor) + w.lexical_weight * lz.get(i, lfloor)
        if i in dz:
            sources[i].add("dense")
        if i in lz:
            sources[i].add("lexical")
    reader.heads(list(fused))
    return _RefRanking(reader, fused, sources, dfloor + w.lexical_weight * lfloor)


def _ref_lift_topics_and_time(r, topic_norm, time_range, names_day, w):  # type: ignore[no-untyped-def]
    boost = w.dated_boost if names_day else w.time_boost
    for i, ex in r.exchanges.items():
        if i not in r.fused:
            continue
        if ex.topic_id is not None and ex.topic_id in topic_norm:
            r.fused[i] += w.topic_lift * topic_norm[ex.topic_id]
        if time_range is not None and time_range[0] <= ex.user_at < time_range[1]:
            r.fused[i] += boost
            r.sources[i].add("time")


def _ref_lift_exact(r, terms, w, where):  # type: ignore[no-untyped-def]
    for i, lift in scoring.exact_hits(r.reader, terms, w, where):
        r.fused[i] = r.fused.get(i, r.floor) + lift
        r.sources[i].add("exact")


def _ref_add_neighbours(r, w, where):  # type: ignore[no-untyped-def]
    if w.neighbour_weight <= 0:
        return
    exchanges = r.exchanges
    by_seq = {(ex.session_id, ex.seq): i for i, ex in exchanges.items()}
    strongest = r.order()[: w.neighbours]
    want = sorted({exchanges[i].seq + d for i in strongest for d in (-1, 1)} - {s for (_, s) in by_seq})
    for nb in r.reader.by_seq(want, where):
        if (nb.session_id, nb.seq) in by_seq or nb.status != "completed" or nb.archived:
            continue
        exchanges[nb.id] = nb
        r.fused[nb.id] = r.floor
        by_seq[(nb.session_id, nb.seq)] = nb.id
        r.sources[nb.id].add("neighbour")
    base = dict(r.fused)
    floor, weight, fused = r.floor, w.neighbour_weight, r.fused
    for i, s in base.items():
        hit = exchanges.get(i)
        if hit is None:
            continue
        sid, seq = hit.session_id, hit.seq
        before, after = by_seq.get((sid, seq - 1)), by_seq.get((sid, seq + 1))
        best = max(floor, base.get(before, floor) if before else floor, base.get(after, floor) if after else floor)
        fused[i] = s + weight * best


def _ref_lift_coverage(r, terms, w):  # type: ignore[no-untyped-def]
    want = set(index_tokens(" ".join(terms)))
    if not want:
        return
    for i, (user, assistant, _) in r.reader.texts(r.order()[: w.coverage_depth]).items():
        best = max(len(want.intersection(token_set(user))), len(want.intersection(token_set(assistant))))
        r.coverage[i] = best / len(want)
        r.fused[i] += w.coverage_weight * r.coverage[i]


def _ref_feedback(r, terms, n_docs, w):  # type: ignore[no-untyped-def]
    scored = scoring.feedback_scores(r.reader, r.order, terms, n_docs, w)
    if scored is None:
        return
    head, z, floor = scored
    lift = {i: w.feedback_weight * (v - floor) for i, v in z.items()}
    top = max(lift.values(), default=0.0)
    for i in head:
        r.fused[i] += top
    for i, v in lift.items():
        r.fused[i] += v
        if v > 0:
            r.sources[i].add("feedback")


def _ref_candidates(r, dense, k, w):  # type: ignore[no-untyped-def]
    low = min(r.fused.values(), default=0.0)
    cosine = dict(dense)
    unseen = dense[-1][1] if len(dense) >= k else 0.0
    out = {}
    for i, s in r.fused.items():
        ex = r.exchanges.get(i)
        if ex is None or ex.status != "completed" or ex.archived:
            continue
        out[i] = Candidate(i, s - low + 0.01, r.sources[i],
                           cosine.get(i, unseen) + w.relevance_coverage * r.coverage.get(i, 0.0))
    return out


_REFERENCE = {
    "fuse": _ref_fuse, "lift_topics_and_time": _ref_lift_topics_and_time, "lift_exact": _ref_lift_exact,
    "add_neighbours": _ref_add_neighbours, "lift_coverage": _ref_lift_coverage, "feedback": _ref_feedback,
    "candidates": _ref_candidates,
}

# -- a memory with sessions, days, identifiers and repeated themes --------------------------

_THEMES = ["violin lesson", "garden tomatoes", "tax return", "bicycle repair", "japanese grammar", "headache"]
_START = datetime(2023, 1, 2, 9, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def memory(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    path: Path = tmp_path_factory.mktemp("pool") / "m.db"
    mem = Memory(path, embedder=HashEmbedder())
    items = []
    for n in range(240):
        theme = _THEMES[(n * 7 + n // 5) % len(_THEMES)]
        code = f" Order ord{n:04d}c0b2e{n % 10} is on its way." if n % 17 == 0 else ""
        items.append({
            "messages": chat(f"About the {theme}: note {n} for week {n % 9}.{code}",
                             f"Noted the {theme} detail {n % 13}; see also the {_THEMES[n % 6]}."),
            "session_id": f"s{n // 6}",
            "at": _START + timedelta(days=n // 3, minutes=n),
        })
    mem.add_many(items, user_id="u")
    yield mem
    mem.close()


_QUERIES = [
    "violin lesson notes",
    "what did I say about garden tomatoes in February 2023?",
    "ord0017c0b2e7",
    "tax return and bicycle repair last month",
    "japanese grammar week 4 detail",
    "nothing at all like this one",
    "headache on 15 March, 2023",
]


def _candidates(mem: Memory, query: str, where: ExchangeFilter | None) -> tuple[dict[str, Candidate], ExchangeReader]:
    retriever = mem.retriever
    reader = ExchangeReader(mem.store, "u")
    cands, *_ = retriever._score(reader, query, 40, _Clock({}), where)
    return cands, reader


def _view(cands: dict[str, Candidate]) -> list[tuple[str, float, list[str], float]]:
    return [(i, c.score, sorted(c.sources), c.relevance) for i, c in cands.items()]


@pytest.mark.parametrize("where", [None, ExchangeFilter(session_id="s7")])
@pytest.mark.parametrize("query", _QUERIES)
def test_array_stages_score_as_the_dict_stages(memory: Memory, query: str, where: ExchangeFilter | None,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    new, reader = _candidates(memory, query, where)
    for name, fn in _REFERENCE.items():
        monkeypatch.setattr(engine.scoring, name, fn)
    ref, ref_reader = _candidates(memory, query, where)
    assert _view(new) == _view(ref)  # same ids in the same order, scores bit for bit
    assert [c.ex_id for c in scoring.rank_candidates(new, reader.rows)] == \
        [c.ex_id for c in _ref_rank_candidates(ref, ref_reader.rows)]


def test_the_stages_are_exercised(memory: Memory) -> None:
    """The memory and queries above reach every stage: time, exact, neighbour and feedback
    lifts all occur (otherwise the comparison above would pin less than it claims)."""
    seen: set[str] = set()
    for q in _QUERIES:
        cands, _ = _candidates(memory, q, None)
        seen |= {s for c in cands.values() for s in c.sources}
    assert {"dense", "lexical", "time", "exact", "neighbour", "feedback"} <= seen


def test_rank_candidates_keeps_ties_in_conversation_then_pool_order() -> None:
    heads = {f"e{n}": ExchangeHead(f"e{n}", seq, "s", None, _START, "completed", False)
             for n, seq in enumerate([5, 3, 9, 3, 1])}
    scores = [1.0, 2.0, 1.0, 2.0, -0.0]
    cands = {f"e{n}": Candidate(f"e{n}", s) for n, s in enumerate(scores)}
    cands["gone"] = Candidate("gone", 1.0)  # no head: sequence 0
    cands["zero"] = Candidate("zero", 0.0)
    got = [c.ex_id for c in scoring.rank_candidates(cands, heads)]
    assert got == [c.ex_id for c in _ref_rank_candidates(cands, heads)]
    assert scoring.rank_candidates({}, heads) == []


def test_ranking_order_matches_sorted_keys(memory: Memory) -> None:
    reader = ExchangeReader(memory.store, "u")
    ids = [e.id for e in memory.store.list_exchanges("u", limit=50)]
    rng = np.random.default_rng(3)
    score = np.round(rng.normal(size=len(ids)), 1)  # many exact ties
    reader.heads(ids)
    r = scoring.Ranking(reader, [*ids, "missing"], np.append(score, 9.0), defaultdict(set), 0.0)
    assert r.order() == _ref_ranked_ids(r.scores(), reader.rows)
    assert "missing" not in r.order()
