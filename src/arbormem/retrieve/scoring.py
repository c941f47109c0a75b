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
from operator import attrgetter

import numpy as np

from ..config import RecallSettings
from ..models import Exchange
from ..store.base import ExchangeFilter, ExchangeHead
from ..text import identifier_like, idf, index_tokens
from .reader import ExchangeReader

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


def ranked_ids(scores: Mapping[str, float], exchanges: Mapping[str, Exchange | ExchangeHead]) -> list[str]:
    """Ids best first (ties in conversation order), those with a known exchange."""
    # (Sorting key tuples built in one pass: a key function per item cost more than the sort.
    # A user's sequence numbers are unique, so the id never decides.)
    keys = [(-s, ex.seq, i) for i, s in scores.items() if (ex := exchanges.get(i)) is not None]
    keys.sort()
    return [i for _, _, i in keys]


def rank_candidates(cands: Mapping[str, Candidate],
                    exchanges: Mapping[str, Exchange | ExchangeHead]) -> list[Candidate]:
    """Candidates best first, ties in conversation order (then in ``cands`` order)."""
    values = list(cands.values())
    if not values:
        return []
    score = np.fromiter((c.score for c in values), dtype=np.float64, count=len(values))
    # Ties in conversation order (ids are random: ordering ties by id made recall differ
    # between identical runs); an unknown exchange sorts as sequence 0.
    get = exchanges.get
    seq = np.fromiter((ex.seq if (ex := get(i)) is not None else 0 for i in cands), dtype=np.int64, count=len(values))
    # lexsort is stable: equal (score, seq) keep their ``cands`` order, as the former
    # (score, seq, position) tuples did.
    return [values[n] for n in np.lexsort((seq, -score)).tolist()]


_SEQ = attrgetter("seq")
_SESSION = attrgetter("session_id")


class Ranking:
    """The exchange candidates of one query while the stages score them.

    The pool is held as arrays in the order candidates joined it (``ids``; ``pos`` maps an id
    to its place): each stage adds to ``score`` with numpy over the whole pool (~350
    exchanges) instead of walking dicts of them, the same float operations in the same order
    per exchange, so the scores are bit for bit those of a loop. ``seq`` and ``session`` come
    from the heads read for the pool; ``known`` is False for an id whose exchange is gone (no
    head), which ranks nowhere and is never a candidate."""

    def __init__(self, reader: ExchangeReader, ids: list[str], score: np.ndarray,
                 sources: defaultdict[str, set[str]], floor: float) -> None:
        self.reader = reader
        self.ids: list[str] = []
        self.pos: dict[str, int] = {}
        self.score = np.zeros(0, dtype=np.float64)
        self.seq = np.zeros(0, dtype=np.int64)
        self.session = np.zeros(0, dtype=object)
        self.known = np.zeros(0, dtype=bool)
        #: Which indexes and steps brought each candidate (shown in ``Hit.sources``).
        self.sources = sources
        #: The fused score of an exchange found by neither index.
        self.floor = floor
        #: Each read exchange's coverage share (0..1), for the relevance floor.
        self.coverage: dict[str, float] = {}
        self.add(ids, score)

    @property
    def exchanges(self) -> dict[str, Exchange | ExchangeHead]:
        return self.reader.rows

    def add(self, ids: list[str], score: np.ndarray) -> None:
        """Append new ids (not in the pool) with their scores; their heads are read already."""
        if not ids:
            return
        rows = self.reader.rows
        heads = [rows.get(i) for i in ids]
        if any(h is None for h in heads):
            known = np.array([h is not None for h in heads], dtype=bool)
            seq = np.array([h.seq if h is not None else 0 for h in heads], dtype=np.int64)
            session = np.array([h.session_id if h is not None else None for h in heads], dtype=object)
        else:
            known = np.ones(len(heads), dtype=bool)
            seq = np.fromiter(map(_SEQ, heads), dtype=np.int64, count=len(heads))
            # Session ids compared as objects (None too: exchanges without a session are
            # each other's neighbours, as the former (session, seq) keys had them).
            session = np.array(list(map(_SESSION, heads)), dtype=object)
        if self.ids:
            self.score = np.concatenate([self.score, score])
            self.known = np.concatenate([self.known, known])
            self.seq = np.concatenate([self.seq, seq])
            self.session = np.concatenate([self.session, session])
        else:
            self.score, self.known, self.seq, self.session = score, known, seq, session
        self.pos.update(zip(ids, range(len(self.ids), len(self.ids) + len(ids)), strict=True))
        self.ids.extend(ids)

    def order(self) -> list[str]:
        """Ids best first, ties in conversation order, those with a known exchange (as
        ``ranked_ids`` over the pool: a user's sequence numbers are unique, so the id never
        decides; lexsort's float comparison orders exactly as Python's)."""
        known = np.flatnonzero(self.known)
        ranked = known[np.lexsort((self.seq[known], -self.score[known]))]
        ids = self.ids
        return [ids[n] for n in ranked.tolist()]

    def places(self, ids: list[str]) -> np.ndarray:
        """The pool places of ``ids`` (all in the pool)."""
        pos = self.pos
        return np.fromiter((pos[i] for i in ids), dtype=np.int64, count=len(ids))

    def scores(self) -> dict[str, float]:
        """Every pool id's score (a view for tests and debugging)."""
        return dict(zip(self.ids, self.score.tolist(), strict=True))


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
    ids = list(dict.fromkeys([*dz, *lz]))
    dget, lget = dz.get, lz.get
    d = np.fromiter((dget(i, dfloor) for i in ids), dtype=np.float64, count=len(ids))
    lx = np.fromiter((lget(i, lfloor) for i in ids), dtype=np.float64, count=len(ids))
    sources: defaultdict[str, set[str]] = defaultdict(set, {i: {"dense"} for i in dz})
    for i in lz:
        sources[i].add("lexical")
    reader.heads(ids)
    return Ranking(reader, ids, d + w.lexical_weight * lx, sources, dfloor + w.lexical_weight * lfloor)


def lift_topics_and_time(r: Ranking, topic_norm: Mapping[str, float],
                         time_range: tuple[datetime, datetime] | None, names_day: bool,
                         w: RecallSettings) -> None:
    """``lift_topics`` and ``lift_time`` in one pass over the candidates: + ``topic_lift`` x the
    exchange's topic relevance (SeCom: the segment is context for scoring its turns); inside
    the query's time window + ``dated_boost`` when the query names a day (the week up to it
    pins the exchange down), else + ``time_boost`` (a month or "last year" only narrows it)."""
    boost = w.dated_boost if names_day else w.time_boost
    rows = r.exchanges
    lifted: list[int] = []
    relevance: list[float] = []
    timed: list[int] = []
    for n, i in enumerate(r.ids):  # (n: the pool place of i)
        ex = rows.get(i)
        if ex is None:
            continue
        if ex.topic_id is not None and ex.topic_id in topic_norm:
            lifted.append(n)
            relevance.append(topic_norm[ex.topic_id])
        if time_range is not None and time_range[0] <= ex.user_at < time_range[1]:
            timed.append(n)
            r.sources[i].add("time")
    # (Places are unique, so each exchange gets each lift once, topic before time.)
    if lifted:
        r.score[lifted] += w.topic_lift * np.array(relevance, dtype=np.float64)
    if timed:
        r.score[timed] += boost


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
    for i, lift in exact_hits(r.reader, terms, w, where):
        n = r.pos.get(i)
        if n is None:
            r.add([i], np.array([r.floor + lift], dtype=np.float64))
        else:
            r.score[n] = float(r.score[n]) + lift
        r.sources[i].add("exact")


def exact_hits(reader: ExchangeReader, terms: tuple[str, ...], w: RecallSettings,
               where: ExchangeFilter | None) -> list[tuple[str, float]]:
    """``lift_exact``'s finding: each live exchange whose own messages hold some of the
    query's exact terms, with its lift (``exact_weight`` x the share of them it holds)."""
    if w.exact_weight <= 0 or not terms:
        return []
    # Without rare words in play, a query with no identifier costs nothing here.
    asked = [t for t in dict.fromkeys(terms) if w.exact_max_df > 0 or identifier_like(t)]
    if not asked:
        return []
    store, user_id = reader.store, reader.user_id
    df = store.get_term_df(user_id, asked)
    exact = [t for t in asked if 0 < df.get(t, 0)
             and df[t] <= (w.exact_max_hits if identifier_like(t) else w.exact_max_df)]
    if not exact:
        return []
    tokens = {t: set(index_tokens(t)) for t in exact}
    found = store.text_search(user_id, "exchange", sorted(set().union(*tokens.values())),
                              2 * w.exact_max_hits + 2, where)
    ids = [i for i, _ in found]
    reader.heads(ids)
    out = []
    for i, ex in reader.full(ids).items():
        if ex.status != "completed" or ex.archived:
            continue
        own = set(index_tokens(ex.user_text)) | set(index_tokens(ex.assistant_text))
        held = sum(1 for t in exact if tokens[t] and tokens[t] <= own)
        if held:
            out.append((i, w.exact_weight * held / len(exact)))
    return out


def add_neighbours(r: Ranking, w: RecallSettings, where: ExchangeFilter | None) -> None:
    """Neighbour context (SeCom / LongMemEval key expansion, done at query time): a turn next
    to a strong hit in the same session is often the answer (the reply to the question that
    matched), so each exchange gains ``neighbour_weight`` x its best neighbour's score; the
    missing neighbours of the ``neighbours`` strongest hits join at the floor."""
    if w.neighbour_weight <= 0:
        return
    exchanges = r.exchanges
    strongest = r.order()[: w.neighbours]
    # Every exchange read so far counts as present (a user's sequence numbers are unique),
    # the pool's and any other read row (lift_exact reads some it does not lift).
    read = {ex.seq for ex in exchanges.values()}
    want = sorted({exchanges[i].seq + d for i in strongest for d in (-1, 1)} - read)
    joined: list[str] = []
    for nb in r.reader.by_seq(want, where):
        if nb.seq in read or nb.status != "completed" or nb.archived:
            continue
        exchanges[nb.id] = nb
        read.add(nb.seq)
        joined.append(nb.id)
        r.sources[nb.id].add("neighbour")
    r.add(joined, np.full(len(joined), r.floor, dtype=np.float64))
    # Each known exchange's neighbours at seq - 1 and seq + 1 in the same session: those in
    # the pool lend their score, any other (read, not a candidate, or unread) the floor.
    base, floor = r.score, r.floor
    known = np.flatnonzero(r.known)
    if not known.size:
        return
    by_seq = known[np.argsort(r.seq[known], kind="stable")]
    seqs = r.seq[by_seq]

    def neighbour(d: int) -> np.ndarray:
        want_seq = r.seq + d
        at = np.minimum(np.searchsorted(seqs, want_seq), len(seqs) - 1)
        n = by_seq[at]
        hit = r.known & (seqs[at] == want_seq) & (r.session[n] == r.session)
        return np.where(hit, base[n], floor)

    best = np.maximum(np.maximum(floor, neighbour(-1)), neighbour(1))
    r.score = np.where(r.known, base + w.neighbour_weight * best, base)


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
    reader = r.reader
    read = reader.texts(r.order()[: w.coverage_depth])
    shares = []
    for i in read:
        best = max(len(want.intersection(reader.index_tokens(i, 0))),
                   len(want.intersection(reader.index_tokens(i, 1))))
        shares.append(best / len(want))
    r.coverage.update(zip(read, shares, strict=True))
    r.score[r.places(list(read))] += w.coverage_weight * np.array(shares, dtype=np.float64)


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
    scored = feedback_scores(r.reader, r.order, terms, n_docs, w)
    if scored is None:
        return
    head, z, floor = scored
    lifted = list(z)
    lift = w.feedback_weight * (np.fromiter((z[i] for i in lifted), dtype=np.float64, count=len(lifted)) - floor)
    top = float(lift.max()) if lifted else 0.0
    # a uniform shift: the head keeps its order, and stays ahead of the tail
    r.score[r.places(head)] += top
    r.score[r.places(lifted)] += lift
    for i, v in zip(lifted, lift.tolist(), strict=True):
        if v > 0:
            r.sources[i].add("feedback")


def feedback_scores(reader: ExchangeReader, ranked: Callable[[], list[str]], terms: tuple[str, ...],
                    n_docs: int, w: RecallSettings) -> tuple[list[str], dict[str, float], float] | None:
    """``feedback``'s scoring over the ranking (``ranked``, called only when feedback
    applies): the head that keeps its places, and the tail's standardised BM25 scores of the
    expansion terms with their floor (None: no feedback for this query)."""
    if w.feedback_weight <= 0 or not terms:
        return None
    order = ranked()
    head = order[: w.feedback_keep]
    tail = order[w.feedback_keep : w.feedback_keep + w.feedback_depth]
    if not tail:
        return None
    docs = reader.texts(order[: w.feedback_docs])
    asked = set(terms)
    weight: dict[str, float] = defaultdict(float)
    for i in docs:
        counts = reader.term_counts(i)
        size = sum(counts.values()) or 1
        for t, n in counts.items():
            if t not in asked:
                weight[t] += n / size
    if not weight:
        return None
    df = reader.store.get_term_df(reader.user_id, list(weight))
    # A term in one exchange only cannot lead anywhere new (that one is already in hand).
    expansion = {t: idf(df[t], n_docs) for t in weight if df.get(t, 0) >= 2}
    expansion = dict(sorted(expansion.items(), key=lambda kv: (-weight[kv[0]] * kv[1], kv[0]))
                     [: w.feedback_terms])
    if not expansion:
        return None
    texts = {i: reader.term_counts(i) for i in reader.texts(tail)}
    lengths = {i: sum(c.values()) for i, c in texts.items()}
    avg = max(1.0, sum(lengths.values()) / max(1, len(lengths)))
    scored: list[tuple[str, float]] = []
    for i, c in texts.items():  # BM25, k1 = 1.2, b = 0.75
        norm = 1.2 * (0.25 + 0.75 * lengths[i] / avg)
        scored.append((i, sum(x * c[t] * 2.2 / (c[t] + norm) for t, x in expansion.items() if t in c)))
    # Standardised over the whole re-scored tail (exchanges holding no expansion term
    # included), so the lift measures how far an exchange stands out from that tail.
    z, floor = standardise(scored)
    return head, z, floor


def candidates(r: Ranking, dense: list[tuple[str, float]], k: int, w: RecallSettings) -> dict[str, Candidate]:
    """The live candidates (completed, not archived) with positive scores and their
    ``relevance``: dense cosine + ``relevance_coverage`` x the coverage share. Both measure
    the pair alone, so relevance compares across queries and memory sizes (unlike BM25 or
    fused z-scores); the relevance floor reads it."""
    # Shift to positive scores (later steps, e.g. the LLM planner, lift multiplicatively).
    low = float(r.score.min()) if r.ids else 0.0
    cosine = dict(dense)
    # An exchange outside the dense top-k is no closer than the k-th one (an upper bound;
    # a shorter list held every vector the search admitted).
    unseen = dense[-1][1] if len(dense) >= k else 0.0
    rows, sources, coverage, rc = r.exchanges, r.sources, r.coverage, w.relevance_coverage
    out = {}
    for i, s in zip(r.ids, ((r.score - low) + 0.01).tolist(), strict=True):
        ex = rows.get(i)
        if ex is None or ex.status != "completed" or ex.archived:
            continue
        out[i] = Candidate(i, s, sources[i], cosine.get(i, unseen) + rc * coverage.get(i, 0.0))
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
