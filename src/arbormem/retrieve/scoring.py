"""The ranking formula of recall, in one place: named stages over one weights object.

The weights are ``config.RecallSettings`` (``w`` below: every weight a user may change) plus
the few structural constants of this module. A recall runs the stages in this order over one
:class:`Ranking` (each candidate's fused score, the indexes and steps it came from, and the
exchanges read so far); each stage adds to the fused score. What each stage is worth was
measured on the LoCoMo development split (docs/recall.md: the ablation and its rounds; "at N"
is evidence recall at an N-token budget):

=================  =====================================================  ==========================================
stage              adds to an exchange's score                            worth (docs/recall.md)
=================  =====================================================  ==========================================
``fuse``           z(dense) + ``w.lexical_weight`` x z(BM25), each list   ranking recall@10 0.675 (reciprocal-rank
                   standardised, a missing item at the list's floor       fusion) -> 0.755
``lift_topics``    ``w.topic_lift`` x its topic's relevance (reciprocal   +0.4 at 2,048, +0.3 at 4,096, -0.8 at 512:
                   rank over both topic indexes, linked topics a          within noise; kept as the structure's
                   ``LINK_WEIGHT`` share), 0..1                           signal to ranking
``lift_time``      ``w.time_boost`` inside the query's time window;       named-day lift: +1.3 at 256, +1.3 at 512
                   ``w.dated_boost`` when the query names a day
``lift_exact``     ``w.exact_weight`` x the share of the query's          codes asked bare found 93 -> 100 of 100;
                   identifier-like terms its own messages hold            LoCoMo unchanged (no identifiers)
``add_neighbours`` ``w.neighbour_weight`` x its best same-session         ranking recall@10 0.755 -> 0.800
                   neighbour's score (neighbours of the strongest join)
``lift_coverage``  ``w.coverage_weight`` x the largest share of query     +2.8 at 256, +2.5 at 512, +1.0 at 1,024,
                   terms one of its messages holds (best ``coverage_      +0.2 at 2,048
                   depth``)
``feedback``       ``w.feedback_weight`` x z(BM25 of the best hits'       +0.6 at 2,048 on the pooled haystack;
                   distinctive terms), the tail below the best            per conversation -0.3..+1.9 at 2,048
                   ``feedback_keep`` only
``relevance``      not a score: cosine + ``w.relevance_coverage`` x the   the floor gates 87% of null questions and
                   coverage share, read by the relevance floor            lets 99% of answerable ones through
=================  =====================================================  ==========================================

Two later adjustments act on the candidates' final scores and live with what they serve:
consolidation's marks (``organize.consolidate.recall_marks``: an update outranks the fact it
superseded, pinned topics' latest exchanges come first) and the optional LLM plan
(``retrieve/llm_plan.py``, lifts relative to the best offline score, ``PLAN_*`` below).

The hand-set weights were checked against fitted rankers over the same signals (logistic
regression, boosted trees): none did better (docs/recall.md, sixth round).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from ..config import RecallSettings
from ..models import Exchange
from ..store.base import ExchangeFilter, ExchangeHead
from ..text import identifier_like, idf, index_tokens
from .reader import ExchangeReader, token_set

#: Reciprocal-rank constant of the topic fusion (the usual 60; 10 or 2 were within +-0.3).
RRF_K = 60.0
#: Topic candidates kept per topic index: the best 12 ranks (a few more rows are read from
#: the dense index, for merged topics' parts folded away).
TOPIC_RANKS = 12
TOPIC_DENSE_ROWS = 16
#: Topics whose cross-links are followed (the strongest ones), each link scored LINK_WEIGHT
#: (organize/consolidate.py, where it is calibrated) x the linking topic's score.
LINK_TOP = 3

#: LLM plan lifts (retrieve/llm_plan.py), all relative to the best offline score ``top``: a
#: selected topic's candidates become max(score x (1 + PLAN_TOPIC_MUL x lift), top x (1 +
#: PLAN_TOPIC_TOP x lift)), lift = 1 - PLAN_RANK_STEP x its rank in the plan (a topic with no
#: candidate adds its two best exchanges, the second PLAN_JOIN_STEP lower); the rewritten
#: query's lexical hits add PLAN_LEXICAL_RRF x their reciprocal rank; a time window only the
#: plan found lifts to max(score x PLAN_TIME_MUL, top x PLAN_TIME_TOP).
PLAN_RANK_STEP = 0.2
PLAN_TOPIC_MUL = 0.6
PLAN_TOPIC_TOP = 0.5
PLAN_JOIN_STEP = 0.1
PLAN_LEXICAL_RRF = 0.5
PLAN_TIME_MUL = 1.5
PLAN_TIME_TOP = 1.2


@dataclass(slots=True)
class Candidate:
    """One exchange in the final ranking."""

    ex_id: str
    score: float = 0.0
    sources: set[str] = field(default_factory=set)
    #: Calibrated relevance (``relevance``): comparable across queries and memories.
    relevance: float = 0.0


def rrf(ranked: list[tuple[str, float]], weight: float = 1.0) -> dict[str, float]:
    """Reciprocal-rank scores of a result list, best first."""
    return {item: weight / (RRF_K + rank + 1) for rank, (item, _) in enumerate(ranked)}


def standardise(ranked: list[tuple[str, float]]) -> tuple[dict[str, float], float]:
    """z-scores of a truncated result list, and the floor for items not in it (its minimum)."""
    if not ranked:
        return {}, 0.0
    values = np.array([s for _, s in ranked], dtype=np.float64)
    mu, sd = float(values.mean()), float(values.std())
    sd = sd if sd > 1e-9 else 1.0
    z = {i: (s - mu) / sd for i, s in ranked}
    return z, (float(values.min()) - mu) / sd


def _seq(exchanges: Mapping[str, Exchange | ExchangeHead], ex_id: str) -> int:
    """Tie-break key: equal scores rank in conversation order. (Ids are random, so ordering
    ties by id made recall differ between identical runs.)"""
    ex = exchanges.get(ex_id)
    return ex.seq if ex is not None else 0


def ranked_ids(scores: Mapping[str, float], exchanges: Mapping[str, Exchange | ExchangeHead]) -> list[str]:
    """Ids best first (ties in conversation order), those with a known exchange."""
    # (Sorting key tuples built in one pass: a key function per item cost more than the sort.
    # A user's sequence numbers are unique, so the id never decides.)
    keys = [(-s, ex.seq, i) for i, s in scores.items() if (ex := exchanges.get(i)) is not None]
    keys.sort()
    return [i for _, _, i in keys]


def rank_candidates(cands: Mapping[str, Candidate],
                    exchanges: Mapping[str, Exchange | ExchangeHead]) -> list[Candidate]:
    """Candidates best first, ties in conversation order."""
    order = sorted([(-c.score, _seq(exchanges, i), n) for n, (i, c) in enumerate(cands.items())])
    values = list(cands.values())
    return [values[n] for _, _, n in order]


@dataclass
class Ranking:
    """The exchange candidates of one query while the stages score them."""

    reader: ExchangeReader
    fused: dict[str, float]
    #: Which indexes and steps brought each candidate (shown in ``Hit.sources``).
    sources: defaultdict[str, set[str]]
    #: The fused score of an exchange found by neither index.
    floor: float
    #: Each read exchange's coverage share (0..1), for the relevance floor.
    coverage: dict[str, float] = field(default_factory=dict)

    @property
    def exchanges(self) -> dict[str, Exchange | ExchangeHead]:
        return self.reader.rows

    def order(self) -> list[str]:
        return ranked_ids(self.fused, self.reader.rows)


# -- the stages ------------------------------------------------------------------------------

def topic_relevance(tdense: list[tuple[str, int]], tlex: list[tuple[str, float]],
                    links: Callable[[Mapping[str, float]], Mapping[str, float]]) -> dict[str, float]:
    """Topic relevance 0..1: reciprocal-rank fusion of the topic indexes (``tdense`` holds
    (topic, rank)), plus what ``links`` gives the topics linked to the strongest ones
    (consolidation's cross-links: ``LINK_WEIGHT`` x the linking topic's score), over the best
    topic's score."""
    scores: dict[str, float] = defaultdict(float)
    for tid, r in tdense:
        scores[tid] += 1.0 / (RRF_K + r + 1)
    for tid, s in rrf(tlex).items():
        scores[tid] += s
    scores.update(links(scores))
    top = max(scores.values(), default=1.0)
    return {t: s / top for t, s in scores.items()}


def fuse(dense: list[tuple[str, float]], lex: list[tuple[str, float]], reader: ExchangeReader,
         w: RecallSettings) -> Ranking:
    """z(dense) + ``lexical_weight`` x z(BM25). Score fusion on standardised scores rather than
    ranks: on the development split it beat reciprocal-rank fusion by ~8 points of recall@10
    (ranks throw away how far ahead a hit is). Items missing from one list get its floor.
    Reads the candidates' heads (seq, session, topic, time), all later stages need."""
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
    return Ranking(reader, fused, sources, dfloor + w.lexical_weight * lfloor)


def lift_topics_and_time(r: Ranking, topic_norm: Mapping[str, float],
                         time_range: tuple[datetime, datetime] | None, names_day: bool,
                         w: RecallSettings) -> None:
    """``lift_topics`` and ``lift_time`` in one pass over the candidates: + ``topic_lift`` x the
    exchange's topic relevance (SeCom: the segment is context for scoring its turns); inside
    the query's time window + ``dated_boost`` when the query names a day (the week up to it
    pins the exchange down), else + ``time_boost`` (a month or "last year" only narrows it)."""
    boost = w.dated_boost if names_day else w.time_boost
    for i, ex in r.exchanges.items():
        if i not in r.fused:
            continue
        if ex.topic_id is not None and ex.topic_id in topic_norm:
            r.fused[i] += w.topic_lift * topic_norm[ex.topic_id]
        if time_range is not None and time_range[0] <= ex.user_at < time_range[1]:
            r.fused[i] += boost
            r.sources[i].add("time")


def lift_exact(r: Ranking, terms: tuple[str, ...], w: RecallSettings, where: ExchangeFilter | None) -> None:
    """Lift the exchanges whose own messages hold the query's exact terms.

    An identifier ("ord3fa91c0b2e", "481516234200") or a word found in very few of the
    user's exchanges singles out the exchange that holds it, but z-score fusion gives a
    lexical list of one to three hits (the exchange and the neighbours whose keys quote
    it) almost no weight against 200 dense candidates: the exchange holding an order
    number fell out of the top 60 behind dense noise and missed the coverage step too.
    Here the lexical index finds the exchanges whose keys hold such a term, those whose
    own messages hold it are lifted by ``exact_weight`` x the share of the exact terms
    they hold (neighbours that only quote it are not), joining the candidates if they
    were not among them. Identifier-like terms count when they are in at most
    ``exact_max_hits`` exchanges, other words when in at most ``exact_max_df``.
    """
    if w.exact_weight <= 0 or not terms:
        return
    # Without rare words in play, a query with no identifier costs nothing here.
    asked = [t for t in dict.fromkeys(terms) if w.exact_max_df > 0 or identifier_like(t)]
    if not asked:
        return
    store, user_id = r.reader.store, r.reader.user_id
    df = store.get_term_df(user_id, asked)
    exact = [t for t in asked if 0 < df.get(t, 0)
             and df[t] <= (w.exact_max_hits if identifier_like(t) else w.exact_max_df)]
    if not exact:
        return
    tokens = {t: set(index_tokens(t)) for t in exact}
    found = store.text_search(user_id, "exchange", sorted(set().union(*tokens.values())),
                              2 * w.exact_max_hits + 2, where)
    ids = [i for i, _ in found]
    r.reader.heads(ids)
    for i, ex in r.reader.full(ids).items():
        if ex.status != "completed" or ex.archived:
            continue
        own = set(index_tokens(ex.user_text)) | set(index_tokens(ex.assistant_text))
        held = sum(1 for t in exact if tokens[t] and tokens[t] <= own)
        if held:
            r.fused[i] = r.fused.get(i, r.floor) + w.exact_weight * held / len(exact)
            r.sources[i].add("exact")


def add_neighbours(r: Ranking, w: RecallSettings, where: ExchangeFilter | None) -> None:
    """Neighbour context (SeCom / LongMemEval key expansion, done at query time): a turn next
    to a strong hit in the same session is often the answer (the reply to the question that
    matched), so each exchange gains ``neighbour_weight`` x its best neighbour's score; the
    missing neighbours of the ``neighbours`` strongest hits join at the floor."""
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


def lift_coverage(r: Ranking, terms: tuple[str, ...], w: RecallSettings) -> None:
    """Lift the best exchanges by how many of the query's terms one of their messages holds.

    BM25 runs over enriched keys (an exchange plus its neighbours' text), and the dense
    vector sees the whole exchange: neither tells a message that answers on the query's
    words from a pair where they are scattered over three turns. Reading the top
    ``coverage_depth`` exchanges (most are packed anyway, so fetched once) and adding
    ``coverage_weight x`` the largest share of query terms (Porter stems) that one message
    holds sharpens the head of the ranking. Query terms go through the index's own tokenizer
    (a term "café" or "o'neil" must match the message tokens "cafe", "o", "neil"). Records
    each read exchange's share, which the relevance floor reads too (even at weight 0).
    """
    want = set(index_tokens(" ".join(terms)))
    if not want:
        return
    for i, (user, assistant) in r.reader.texts(r.order()[: w.coverage_depth]).items():
        best = max(len(want.intersection(token_set(user))), len(want.intersection(token_set(assistant))))
        r.coverage[i] = best / len(want)
        r.fused[i] += w.coverage_weight * r.coverage[i]


def feedback(r: Ranking, terms: tuple[str, ...], n_docs: int, w: RecallSettings) -> None:
    """Pseudo-relevance feedback for the tail of the ranking (RM3-like, lexical).

    List questions ("what activities has she done with her family?") have answers spread
    over many exchanges, most of which share no word with the question ("swimming with
    the kids"); the best hits do share words with them ("kids", "fam"). The
    ``feedback_terms`` most distinctive terms of the ``feedback_docs`` best exchanges
    (term frequency x IDF) score the next ``feedback_depth`` exchanges by BM25, whose
    standardised scores lift them by ``feedback_weight``. Expansion drifts from the
    question, which hurts the head of the ranking (-3 points of evidence recall at 256
    tokens when applied to all), so the ``feedback_keep`` best exchanges keep their places
    ahead of the rest and only the tail below them is re-ordered.
    The scoring runs here over those exchanges' text rather than as a second full-text
    query: twenty OR-ed terms made the index score every exchange holding any of them
    (+22 ms at 10k exchanges), and only the tail is re-ordered anyway.
    """
    if w.feedback_weight <= 0 or not terms:
        return
    order = r.order()
    head = order[: w.feedback_keep]
    tail = order[w.feedback_keep : w.feedback_keep + w.feedback_depth]
    if not tail:
        return
    docs = r.reader.texts(order[: w.feedback_docs])
    asked = set(terms)
    weight: dict[str, float] = defaultdict(float)
    for i in docs:
        counts = r.reader.term_counts(i)
        size = sum(counts.values()) or 1
        for t, n in counts.items():
            if t not in asked:
                weight[t] += n / size
    if not weight:
        return
    df = r.reader.store.get_term_df(r.reader.user_id, list(weight))
    # A term in one exchange only cannot lead anywhere new (that one is already in hand).
    expansion = {t: idf(df[t], n_docs) for t in weight if df.get(t, 0) >= 2}
    expansion = dict(sorted(expansion.items(), key=lambda kv: (-weight[kv[0]] * kv[1], kv[0]))
                     [: w.feedback_terms])
    if not expansion:
        return
    texts = {i: r.reader.term_counts(i) for i in r.reader.texts(tail)}
    lengths = {i: sum(c.values()) for i, c in texts.items()}
    avg = max(1.0, sum(lengths.values()) / max(1, len(lengths)))
    scored: list[tuple[str, float]] = []
    for i, c in texts.items():  # BM25, k1 = 1.2, b = 0.75
        norm = 1.2 * (0.25 + 0.75 * lengths[i] / avg)
        scored.append((i, sum(x * c[t] * 2.2 / (c[t] + norm) for t, x in expansion.items() if t in c)))
    # Standardised over the whole re-scored tail (exchanges holding no expansion term
    # included), so the lift measures how far an exchange stands out from that tail.
    z, floor = standardise(scored)
    lift = {i: w.feedback_weight * (v - floor) for i, v in z.items()}
    top = max(lift.values(), default=0.0)
    for i in head:  # a uniform shift: the head keeps its order, and stays ahead of the tail
        r.fused[i] += top
    for i, v in lift.items():
        r.fused[i] += v
        if v > 0:
            r.sources[i].add("feedback")


def candidates(r: Ranking, dense: list[tuple[str, float]], k: int, w: RecallSettings) -> dict[str, Candidate]:
    """The live candidates (completed, not archived) with positive scores and their
    ``relevance``: dense cosine + ``relevance_coverage`` x the coverage share. Both measure
    the pair alone, so relevance compares across queries and memory sizes (unlike BM25 or
    fused z-scores); the relevance floor reads it."""
    # Shift to positive scores (later steps, e.g. the LLM planner, lift multiplicatively).
    low = min(r.fused.values(), default=0.0)
    cosine = dict(dense)
    # An exchange outside the dense top-k is no closer than the k-th one (an upper bound;
    # a shorter list held every vector the search admitted).
    unseen = dense[-1][1] if len(dense) >= k else 0.0
    out = {}
    for i, s in r.fused.items():
        ex = r.exchanges.get(i)
        if ex is None or ex.status != "completed" or ex.archived:
            continue
        out[i] = Candidate(i, s - low + 0.01, r.sources[i],
                           cosine.get(i, unseen) + w.relevance_coverage * r.coverage.get(i, 0.0))
    return out


__all__ = [
    "Candidate",
    "LINK_TOP",
    "RRF_K",
    "Ranking",
    "TOPIC_DENSE_ROWS",
    "TOPIC_RANKS",
    "add_neighbours",
    "candidates",
    "feedback",
    "fuse",
    "lift_coverage",
    "lift_exact",
    "lift_topics_and_time",
    "rank_candidates",
    "ranked_ids",
    "rrf",
    "standardise",
    "topic_relevance",
]
