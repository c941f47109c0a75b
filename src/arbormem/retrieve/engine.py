"""The read path: candidates from every index, score fusion, topic-aware scoring, packing.

1. Analyse the query (terms, names, time window) and embed it once.
2. Candidates: exchanges by dense and lexical search, topics by dense and lexical search.
3. Fuse exchange scores as standardised scores (z(dense) + w * z(BM25)); a topic's fused rank
   score lifts its exchanges (SeCom: the segment is context for scoring its turns); a time
   window from the query lifts the exchanges inside it (more when the query names a day).
4. Neighbour context: each exchange gains a share of its best same-session neighbour's score
   (the answer is often the turn after the matching question).
5. Coverage: the best exchanges gain by the share of query terms one of their messages holds.
6. Feedback: the best exchanges' distinctive terms re-score the tail of the ranking (the head
   keeps its places).
7. Pack greedily by score under the budget, recent exchanges first within their share; render
   topic packets in time order, refill from the exact token count, verify it.

docs/recall.md gives the measured worth of every step.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, cast

import numpy as np

from ..config import RecallSettings
from ..embed.base import Embedder
from ..models import Exchange, Hit, Recall, RecallTrace, Topic
from ..organize.aliases import resolve_topic_hits
from ..organize.recall_hooks import linked_topics, recall_marks
from ..store.base import ExchangeFilter, ExchangeHead, Store, TopicRecord
from ..text import identifier_like, idf, index_tokens, term_counts, terms
from ..tokens import TokenCounter
from .query import QueryAnalysis, analyse

if TYPE_CHECKING:  # pragma: no cover
    from .llm_plan import RecallPlanner
from ..render import message_text, packet_header, render, render_exchange, speaker
from .topics import TopicPaths

RRF_K = 60.0


@dataclass
class _Cand:
    ex_id: str
    score: float = 0.0
    sources: set[str] = field(default_factory=set)
    #: Calibrated relevance (``relevance``): comparable across queries and memories.
    relevance: float = 0.0


def rrf(ranked: list[tuple[str, float]], weight: float = 1.0) -> dict[str, float]:
    return {item: weight / (RRF_K + rank + 1) for rank, (item, _) in enumerate(ranked)}


def _seq(exchanges: Mapping[str, Exchange | ExchangeHead], ex_id: str) -> int:
    """Tie-break key: equal scores rank in conversation order. (Ids are random, so ordering
    ties by id made recall differ between identical runs.)"""
    ex = exchanges.get(ex_id)
    return ex.seq if ex is not None else 0


def _ranked(fused: Mapping[str, float], exchanges: Mapping[str, Exchange | ExchangeHead]) -> list[str]:
    """Candidate ids best first (ties in conversation order), those with a known exchange."""
    return [i for i in sorted(fused, key=lambda i: (-fused[i], _seq(exchanges, i))) if i in exchanges]


def _standardise(ranked: list[tuple[str, float]]) -> tuple[dict[str, float], float]:
    """z-scores of a truncated result list, and the floor for items not in it (its minimum)."""
    if not ranked:
        return {}, 0.0
    values = np.array([s for _, s in ranked], dtype=np.float64)
    mu, sd = float(values.mean()), float(values.std())
    sd = sd if sd > 1e-9 else 1.0
    z = {i: (s - mu) / sd for i, s in ranked}
    return z, (float(values.min()) - mu) / sd


class Retriever:
    """Search and recall over one store with one embedder."""

    def __init__(self, store: Store, embedder: Embedder, counter: TokenCounter, settings: RecallSettings) -> None:
        self.store = store
        self.embedder = embedder
        self.counter = counter
        self.s = settings

    # -- shared candidate generation -------------------------------------------------------------
    def _score(self, user_id: str, q: QueryAnalysis, qvec: np.ndarray, k: int, n_docs: int,
               timings: dict[str, float], where: ExchangeFilter | None = None,
               ) -> tuple[dict[str, _Cand], dict[str, float], dict[str, Exchange | ExchangeHead]]:
        t0 = time.perf_counter()
        dense = self.store.vector_search(user_id, "exchange", qvec, k, where)
        lex = self.store.text_search(user_id, "exchange", q.terms, k, where) if q.terms else []
        # A merged topic keeps its parts' centroids as aliases (organize/consolidate.py) and
        # ranks as its best part; ranks count parts as topics, so the top 12 ranks are taken
        # (from a few extra rows, for the parts folded away).
        tdense = [(tid, r) for tid, _, r in resolve_topic_hits(
            self.store.vector_search(user_id, "topic", qvec, 16)) if r < 12]
        tlex = self.store.text_search(user_id, "topic", q.terms, 12) if q.terms else []
        timings["indexes"] = (time.perf_counter() - t0) * 1000

        topic_scores: dict[str, float] = defaultdict(float)
        for tid, r in tdense:
            topic_scores[tid] += 1.0 / (RRF_K + r + 1)
        for tid, s in rrf(tlex).items():
            topic_scores[tid] += s
        # Cross-links made by consolidation: topics linked to the 3 strongest get a share
        # (LINK_WEIGHT) of the linking topic's score; 3 topic rows read per recall.
        topic_scores.update(linked_topics(self.store, user_id, topic_scores, top=3))
        top_rrf = max(topic_scores.values(), default=1.0)
        topic_norm = {t: s / top_rrf for t, s in topic_scores.items()}

        # Score fusion on standardised scores rather than ranks: on the development split
        # z-score fusion of dense and BM25 beat reciprocal-rank fusion by ~8 points of
        # recall@10 (ranks throw away how far ahead a hit is). Items missing from one list
        # get that list's floor.
        dz, dfloor = _standardise(dense)
        lz, lfloor = _standardise([(i, s) for i, s in lex if s > 0])
        fused: dict[str, float] = {}
        sources: dict[str, set[str]] = defaultdict(set)
        for i in dict.fromkeys([*dz, *lz]):
            fused[i] = dz.get(i, dfloor) + self.s.lexical_weight * lz.get(i, lfloor)
            if i in dz:
                sources[i].add("dense")
            if i in lz:
                sources[i].add("lexical")
        floor = dfloor + self.s.lexical_weight * lfloor
        # Scoring needs only seq/session/topic/time: fetch heads, not whole exchanges; the
        # few that get packed are fetched whole later.
        exchanges: dict[str, Exchange | ExchangeHead] = {
            h.id: h for h in self.store.exchange_heads(user_id, list(fused))}
        for i, ex in exchanges.items():
            if ex.topic_id in topic_norm:
                fused[i] += self.s.topic_lift * topic_norm[ex.topic_id]
            if q.time_range is not None and q.time_range[0] <= ex.user_at < q.time_range[1]:
                # A named day pins the exchange down (the week up to it); a month or "last
                # year" only narrows it.
                fused[i] += self.s.dated_boost if q.names_day else self.s.time_boost
                sources[i].add("time")

        if self.s.exact_weight > 0 and q.terms:
            for i in self._exact(user_id, q.terms, fused, exchanges, floor, where):
                sources[i].add("exact")

        # Neighbour context (SeCom / LongMemEval key expansion, done at query time): a turn
        # next to a strong hit in the same session is often the answer (the reply to the
        # question that matched), so each exchange gains beta x its best neighbour's score.
        if self.s.neighbour_weight > 0:
            by_seq = {(ex.session_id, ex.seq): i for i, ex in exchanges.items()}
            strongest = _ranked(fused, exchanges)[: self.s.neighbours]
            want = sorted({exchanges[i].seq + d for i in strongest for d in (-1, 1)}
                          - {s for (_, s) in by_seq})
            for nb in self.store.exchanges_by_seq(user_id, want, where):
                if (nb.session_id, nb.seq) in by_seq or nb.status != "completed" or nb.archived:
                    continue
                exchanges[nb.id] = nb
                fused[nb.id] = floor
                by_seq[(nb.session_id, nb.seq)] = nb.id
                sources[nb.id].add("neighbour")
            base = dict(fused)
            for i in list(fused):
                hit = exchanges.get(i)
                if hit is None:
                    continue
                best_nb = max((base[j] for d in (-1, 1)
                               if (j := by_seq.get((hit.session_id, hit.seq + d))) is not None), default=floor)
                fused[i] = base[i] + self.s.neighbour_weight * max(best_nb, floor)

        coverage: dict[str, float] = {}
        if q.terms:  # the shares feed the relevance floor too (the weight may be 0)
            coverage = self._coverage(user_id, q.terms, fused, exchanges)
        if self.s.feedback_weight > 0 and q.terms:
            for i in self._feedback(user_id, q.terms, fused, exchanges, n_docs):
                sources[i].add("feedback")

        # Shift to positive scores (later steps, e.g. the LLM planner, lift multiplicatively).
        low = min(fused.values(), default=0.0)
        cosine = dict(dense)
        # An exchange outside the dense top-k is no closer than the k-th one (an upper bound;
        # a shorter list held every vector the search admitted).
        unseen = dense[-1][1] if len(dense) >= k else 0.0
        w = self.s.relevance_coverage
        cands = {i: _Cand(i, s - low + 0.01, sources[i], cosine.get(i, unseen) + w * coverage.get(i, 0.0))
                 for i, s in fused.items()}
        timings["fuse"] = (time.perf_counter() - t0) * 1000 - timings["indexes"]
        live = {i: c for i, c in cands.items()
                if i in exchanges and exchanges[i].status == "completed" and not exchanges[i].archived}
        return live, topic_norm, exchanges

    def _exact(self, user_id: str, terms: tuple[str, ...], fused: dict[str, float],
               exchanges: dict[str, Exchange | ExchangeHead], floor: float,
               where: ExchangeFilter | None = None) -> list[str]:
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
        Returns the exchanges lifted.
        """
        # Without rare words in play, a query with no identifier costs nothing here.
        asked = [t for t in dict.fromkeys(terms) if self.s.exact_max_df > 0 or identifier_like(t)]
        if not asked:
            return []
        df = self.store.get_term_df(user_id, asked)
        exact = [t for t in asked if 0 < df.get(t, 0)
                 and df[t] <= (self.s.exact_max_hits if identifier_like(t) else self.s.exact_max_df)]
        if not exact:
            return []
        tokens = {t: set(index_tokens(t)) for t in exact}
        found = self.store.text_search(user_id, "exchange", sorted(set().union(*tokens.values())),
                                       2 * self.s.exact_max_hits + 2, where)
        ids = [i for i, _ in found]
        fresh = [i for i in ids if i not in exchanges]
        for h in self.store.exchange_heads(user_id, fresh):
            exchanges[h.id] = h
        lifted = []
        for i, ex in self._full(user_id, exchanges, ids).items():
            if ex.status != "completed" or ex.archived:
                continue
            own = set(index_tokens(ex.user_text)) | set(index_tokens(ex.assistant_text))
            held = sum(1 for t in exact if tokens[t] and tokens[t] <= own)
            if held:
                fused[i] = fused.get(i, floor) + self.s.exact_weight * held / len(exact)
                lifted.append(i)
        return lifted

    def _coverage(self, user_id: str, terms: tuple[str, ...], fused: dict[str, float],
                  exchanges: dict[str, Exchange | ExchangeHead]) -> dict[str, float]:
        """Lift the best exchanges by how many of the query's terms one of their messages holds.

        BM25 runs over enriched keys (an exchange plus its neighbours' text), and the dense
        vector sees the whole exchange: neither tells a message that answers on the query's
        words from a pair where they are scattered over three turns. Reading the top
        ``coverage_depth`` exchanges (most are packed anyway, so fetched once) and adding
        ``coverage_weight x`` the largest share of query terms (Porter stems) that one message
        holds sharpens the head of the ranking: on the development split +2.8 points of
        evidence recall at 256 tokens, +2.5 at 512, +1.0 at 1,024, +0.2 at 2,048.
        Query terms go through the index's own tokenizer (a term "café" or "o'neil" must
        match the message tokens "cafe", "o", "neil"). Returns each read exchange's share
        (0..1), which the relevance floor reads too.
        """
        want = set(index_tokens(" ".join(terms)))
        if not want:
            return {}
        top = _ranked(fused, exchanges)
        full = self._full(user_id, exchanges, top[: self.s.coverage_depth])
        shares: dict[str, float] = {}
        for i, ex in full.items():
            best = max(len(want.intersection(index_tokens(m))) for m in (ex.user_text, ex.assistant_text))
            shares[i] = best / len(want)
            fused[i] += self.s.coverage_weight * shares[i]
        return shares

    def _feedback(self, user_id: str, terms: tuple[str, ...], fused: dict[str, float],
                  exchanges: dict[str, Exchange | ExchangeHead], n_docs: int) -> list[str]:
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
        (+22 ms at 10k exchanges, against +1.3 ms here), and only the tail is re-ordered anyway.
        Returns the exchanges it lifted.
        """
        order = _ranked(fused, exchanges)
        head = order[: self.s.feedback_keep]
        tail = order[self.s.feedback_keep : self.s.feedback_keep + self.s.feedback_depth]
        if not tail:
            return []
        docs = self._full(user_id, exchanges, order[: self.s.feedback_docs])
        asked = set(terms)
        weight: dict[str, float] = defaultdict(float)
        for ex in docs.values():
            counts = term_counts(ex.text)
            size = sum(counts.values()) or 1
            for t, n in counts.items():
                if t not in asked:
                    weight[t] += n / size
        if not weight:
            return []
        df = self.store.get_term_df(user_id, list(weight))
        # A term in one exchange only cannot lead anywhere new (that one is already in hand).
        expansion = {t: idf(df[t], n_docs) for t in weight if df.get(t, 0) >= 2}
        expansion = dict(sorted(expansion.items(), key=lambda kv: (-weight[kv[0]] * kv[1], kv[0]))
                         [: self.s.feedback_terms])
        if not expansion:
            return []
        texts = {i: term_counts(ex.text) for i, ex in self._full(user_id, exchanges, tail).items()}
        lengths = {i: sum(c.values()) for i, c in texts.items()}
        avg = max(1.0, sum(lengths.values()) / max(1, len(lengths)))
        scored: list[tuple[str, float]] = []
        for i, c in texts.items():  # BM25, k1 = 1.2, b = 0.75
            norm = 1.2 * (0.25 + 0.75 * lengths[i] / avg)
            scored.append((i, sum(w * c[t] * 2.2 / (c[t] + norm) for t, w in expansion.items() if t in c)))
        # Standardised over the whole re-scored tail (exchanges holding no expansion term
        # included), so the lift measures how far an exchange stands out from that tail.
        z, floor = _standardise(scored)
        lift = {i: self.s.feedback_weight * (v - floor) for i, v in z.items()}
        top = max(lift.values(), default=0.0)
        for i in head:  # a uniform shift: the head keeps its order, and stays ahead of the tail
            fused[i] += top
        for i, v in lift.items():
            fused[i] += v
        return [i for i, v in lift.items() if v > 0]

    def _now_and_size(self, user_id: str) -> tuple[datetime | None, int]:
        """What a query is read against, from the user's newest exchange (one row): its time
        ("last week" counts back from it) and the exchange count for IDF (its sequence number
        + 1; deleted exchanges still count, which IDF does not mind)."""
        last = self.store.list_exchanges(user_id, status="completed", limit=1, newest_first=True)
        return (last[0].user_at, last[0].seq + 1) if last else (None, 1)

    # -- the relevance floor ------------------------------------------------------------------------
    def _floor(self, cands: dict[str, _Cand], min_relevance: float | None,
               spared: set[str] | frozenset[str] = frozenset()) -> tuple[float, float, int, bool]:
        """Apply the relevance floor to ``cands`` in place (docs/recall.md, "Relevance floor").

        The query is answered only when its best candidate's relevance (dense cosine plus
        ``relevance_coverage`` x the share of query terms one message holds: both measure the
        pair alone, so they compare across queries and memory sizes, unlike BM25 or fused
        z-scores) reaches ``min_relevance``; then the candidates below ``floor_share`` x
        ``min_relevance`` (less related than most unrelated pairs) are left out. Otherwise no
        candidate stays. ``min_relevance`` 0 turns it off. Returns (floor, best relevance,
        candidates left out, answered)."""
        if min_relevance is None:
            min_relevance = self.s.min_relevance
        floor = (self.embedder.relevance_floor or 0.0) if min_relevance is None else min_relevance
        best = max((c.relevance for c in cands.values()), default=0.0)
        if floor <= 0:
            return floor, best, 0, True
        answered = best >= floor
        keep = floor * self.s.floor_share
        out = [i for i, c in cands.items() if not answered or (c.relevance < keep and i not in spared)]
        for i in out:
            del cands[i]
        return floor, best, len(out), answered

    # -- public operations ------------------------------------------------------------------------
    def search(self, user_id: str, query: str, limit: int, where: ExchangeFilter | None = None,
               min_relevance: float | None = None) -> list[Hit]:
        now, n_docs = self._now_and_size(user_id)
        q = analyse(query, now)
        qvec = self.embedder.embed_one(query)
        timings: dict[str, float] = {}
        cands, _, exchanges = self._score(user_id, q, qvec, max(limit * 3, self.s.candidates), n_docs, timings,
                                          where)
        self._floor(cands, min_relevance)
        ranked = sorted(cands.values(), key=lambda c: (-c.score, _seq(exchanges, c.ex_id)))[:limit]
        full = self._full(user_id, exchanges, [c.ex_id for c in ranked])
        paths = TopicPaths(self.store, user_id).paths(t for c in ranked if (t := full[c.ex_id].topic_id))
        return [
            Hit(exchange=full[c.ex_id], score=c.score, topic_id=full[c.ex_id].topic_id,
                path=paths.get(full[c.ex_id].topic_id or "", ()), sources=tuple(sorted(c.sources)),
                relevance=round(c.relevance, 4))
            for c in ranked if c.ex_id in full
        ]

    def _full(self, user_id: str, exchanges: dict[str, Exchange | ExchangeHead],
              ids: list[str]) -> dict[str, Exchange]:
        """Whole exchanges for ``ids``, replacing heads in ``exchanges`` (one query)."""
        missing = [i for i in ids if not isinstance(exchanges.get(i), Exchange)]
        for ex in self.store.get_exchanges(user_id, missing):
            exchanges[ex.id] = ex
        return {i: x for i in ids if isinstance(x := exchanges.get(i), Exchange)}

    def recall(self, user_id: str, query: str, max_tokens: int, recent: int,
               to_topic: Callable[[TopicRecord, tuple[str, ...]], Topic],
               planner: RecallPlanner | None = None, where: ExchangeFilter | None = None,
               min_relevance: float | None = None) -> Recall:
        """The packed memory context; ``to_topic`` makes the public view of a packed topic
        from its record and title path. ``where`` restricts every candidate and the recent
        window; ``min_relevance`` overrides the setting (0: fill the budget)."""
        t_start = time.perf_counter()
        timings: dict[str, float] = {}
        now, n_docs = self._now_and_size(user_id)
        q = analyse(query, now)
        t0 = time.perf_counter()
        qvec = self.embedder.embed_one(query)
        timings["embed"] = (time.perf_counter() - t0) * 1000
        cands, topic_norm, exchanges = self._score(user_id, q, qvec, self.s.candidates, n_docs, timings, where)
        notes = list(q.notes)
        if planner is not None:  # the optional LLM step: at most one call (retrieve/llm_plan.py)
            t0 = time.perf_counter()
            before = set(cands)
            notes += planner.apply(self, user_id, query, now, cands, topic_norm, exchanges, q.time_range)
            if where:  # the planner reads the unfiltered tree: keep only what the filter admits
                new = [i for i in cands if i not in before]
                admitted = {e.id for e in self.store.get_exchanges(user_id, new) if where.matches(e)}
                for i in new:
                    if i not in admitted:
                        del cands[i]
            timings["llm_plan"] = (time.perf_counter() - t0) * 1000
        # The model's picks are its judgement: the per-exchange cut spares them (not the gate).
        picked = {i for i, c in cands.items() if any(src.startswith("llm") for src in c.sources)}
        floor, best, below, answered = self._floor(cands, min_relevance, picked)

        # Consolidation marks (organize/consolidate.py): updates outrank the facts they
        # superseded (both stay, rendered marked); pinned topics' latest exchanges come first.
        scores = {i: c.score for i, c in cands.items()}
        # Heads carry the organiser's marks, which is all recall_marks reads of an exchange.
        for i, source in recall_marks(self.store, user_id, scores, cast(dict[str, Exchange], exchanges), max_tokens,
                                      lambda e: self.counter.count(render_exchange(e)) + 1).items():
            ex = exchanges.get(i)
            if where and source == "pinned" and not (isinstance(ex, Exchange) and where.matches(ex)):
                scores.pop(i, None)
                continue
            cands.setdefault(i, _Cand(i)).sources.add(source)
        for i, s in scores.items():
            cands[i].score = s

        # Recent exchanges, within their share of the budget.
        t0 = time.perf_counter()
        recent_list: list[Exchange] = []
        if recent > 0:
            recent_list = list(reversed(self.store.list_exchanges(
                user_id, status="completed", limit=recent, newest_first=True, where=where)))
        tree = TopicPaths(self.store, user_id)
        asked = set(q.terms) if self.s.speaker_focus else set()
        packed, text, tokens, dropped, focused = self._pack(user_id, cands, exchanges, recent_list, max_tokens,
                                                            tree, asked)
        if focused:
            notes.append("lines of " + ", ".join(sorted(focused)) + " only, below the best exchanges")
        stopped = _stopped(floor, floor * self.s.floor_share, best, below, answered,
                           len(cands) - len([e for e in packed if e.id in cands]), max_tokens - tokens)
        timings["pack"] = (time.perf_counter() - t0) * 1000
        timings["total"] = (time.perf_counter() - t_start) * 1000

        topic_ids = [t for t in dict.fromkeys(e.topic_id for e in packed if e.topic_id)]
        topics = tuple(to_topic(rec, tree.path(tid)) for tid in topic_ids if (rec := tree.record(tid)) is not None)
        trace = RecallTrace(
            query_terms=q.terms, candidates=len(cands),
            topic_scores={k: round(v, 4) for k, v in sorted(topic_norm.items(), key=lambda kv: -kv[1])[:10]},
            exchange_scores={e.id: round(cands[e.id].score, 6) for e in packed if e.id in cands},
            timings_ms={k: round(v, 2) for k, v in timings.items()}, budget=max_tokens,
            dropped=dropped, notes=tuple(notes), min_relevance=floor, best_relevance=round(best, 4),
            below_floor=below, stopped=stopped,
        )
        return Recall(text=text, tokens=tokens, exchanges=tuple(packed), topics=topics, trace=trace)

    def _pack(self, user_id: str, cands: Mapping[str, _Cand], exchanges: dict[str, Exchange | ExchangeHead],
              recent: list[Exchange], budget: int, tree: TopicPaths,
              asked: set[str]) -> tuple[list[Exchange], str, int, int, set[str]]:
        """Greedy packing down the ranking. Returns the packed exchanges, the context, its
        exact token count, how many candidates were left out, and the participants whose lines
        alone stood for lower-ranked exchanges (see ``_speaker_focus``)."""
        count = self.counter.count
        blocks: dict[str, str] = {}
        cost: dict[str, int] = {}
        focus: dict[str, frozenset[str]] = {}

        # The best exchanges are packed whole until they have taken this many tokens; below
        # them, speaker focus may stand the asked participants' lines in for an exchange.
        whole_left = self.s.speaker_focus_share * budget

        def block(ex: Exchange, ranked: bool = False) -> str:
            nonlocal whole_left
            if ex.id not in blocks:
                keep = _speaker_focus(ex, asked) if ranked and whole_left <= 0 else None
                if keep is not None:
                    focus[ex.id] = keep
                blocks[ex.id] = render_exchange(ex, speakers=keep)
                cost[ex.id] = count(blocks[ex.id]) + 1
                if ranked:
                    whole_left -= cost[ex.id]
            return blocks[ex.id]

        frame = count(render([("## Topic", [])])) + 1
        if budget <= frame + 8:
            return [], "", 0, len(cands), set()
        used = frame
        chosen: list[Exchange] = []
        chosen_ids: set[str] = set()
        headers: set[str | None] = set()
        per_topic: dict[str | None, int] = defaultdict(int)
        header_cost = 10  # a packet header ("## A › B (2024-03-02)") is ~8-12 tokens

        # Recent exchanges first, capped to their share of the budget.
        recent_cap = int(budget * self.s.recent_share)
        recent_used = 0
        recent_ids: set[str] = set()
        for ex in reversed(recent):
            block(ex)
            need = cost[ex.id] + (header_cost if not recent_ids else 0)
            if recent_used + need > recent_cap:
                break
            recent_used += need
            recent_ids.add(ex.id)
        used += recent_used

        cap_per_topic = max(1, int(budget * self.s.topic_share))
        ranked = sorted(cands.values(), key=lambda c: (-c.score, _seq(exchanges, c.ex_id)))
        # Whole exchanges are fetched in batches down the ranking, only as far as packing gets.
        full: dict[str, Exchange] = {}
        batch = 32

        def fill(used: int) -> bool:
            """Greedy pass down the ranking with estimated costs; True if anything was added."""
            added = False
            misfits = 0
            for pos, c in enumerate(ranked):
                if c.ex_id in recent_ids or c.ex_id in chosen_ids:
                    continue
                if c.ex_id not in full:
                    full.update(self._full(user_id, exchanges, [x.ex_id for x in ranked[pos : pos + batch]]))
                ex = full.get(c.ex_id)
                if ex is None:  # deleted meanwhile
                    continue
                block(ex, ranked=True)
                extra = cost[ex.id] + (0 if ex.topic_id in headers else header_cost)
                if used + extra > budget or per_topic[ex.topic_id] + cost[ex.id] > cap_per_topic:
                    misfits += 1
                    # Nothing useful fits any more, or the next ones are all too long: stop
                    # before fetching and counting the whole tail of the ranking.
                    if budget - used < 24 or misfits >= 16:
                        break
                    continue
                misfits = 0
                used += extra
                headers.add(ex.topic_id)
                per_topic[ex.topic_id] += cost[ex.id]
                chosen.append(ex)
                chosen_ids.add(ex.id)
                added = True
            return added

        fill(used)
        recent_chosen = [e for e in recent if e.id in recent_ids]

        def rendered() -> tuple[str, int]:
            # ``tree`` fetches each topic once: a refill only looks up the topics it added.
            out = self._render(chosen, recent_chosen, tree.paths(t for e in chosen if (t := e.topic_id)), blocks,
                               focus)
            return out, count(out)

        text, tokens = rendered()
        # The estimates count each exchange with its date, but a packet whose exchanges share a
        # day shows it once in the header: the real context is often ~10% under budget. Refill
        # from the real count (at most twice: each pass closes most of the gap).
        for _ in range(2):
            if budget - tokens < 24 or not fill(tokens):
                break
            text, tokens = rendered()
        while tokens > budget:
            # Headers cost more than estimated: drop the lowest-scored item and re-render.
            if chosen:
                worst = min(chosen, key=lambda e: cands[e.id].score if e.id in cands else 0.0)
                chosen.remove(worst)
            elif recent_chosen:
                recent_chosen.pop(0)
            else:
                text, tokens = "", 0
                break
            text, tokens = rendered()
        packed = sorted(chosen, key=lambda e: e.seq) + recent_chosen
        # The participants as their messages name them, for the trace.
        focused = {who for e in chosen if e.id in focus for m in e.messages
                   if (who := speaker(m)).casefold() in focus[e.id]}
        return packed, text, tokens, max(0, len(cands) - len(chosen)), focused

    @staticmethod
    def _render(chosen: list[Exchange], recent: list[Exchange], paths: Mapping[str, tuple[str, ...]],
                blocks: Mapping[str, str], focus: Mapping[str, frozenset[str]]) -> str:
        by_topic: dict[str | None, list[Exchange]] = defaultdict(list)
        for ex in chosen:
            by_topic[ex.topic_id].append(ex)
        # Packets in the order their first exchange happened; exchanges in order inside. When a
        # packet's exchanges share a day it goes in the header once, otherwise on each exchange.
        order = sorted(by_topic.items(), key=lambda kv: min(e.seq for e in kv[1]))
        packets = []
        for tid, exs in order:
            exs.sort(key=lambda e: e.seq)
            days = {e.user_at.date() for e in exs}
            if len(days) == 1:
                header = packet_header(_short(paths.get(tid or "", ())), exs[0].user_at.date().isoformat())
                packets.append((header, [render_exchange(e, dated=False, speakers=focus.get(e.id)) for e in exs]))
            else:
                packets.append((packet_header(_short(paths.get(tid or "", ()))), [blocks[e.id] for e in exs]))
        if recent:
            packets.append(("## Recent", [blocks[e.id] for e in recent]))
        return render(packets)


def _stopped(floor: float, keep: float, best: float, below: int, answered: bool, left: int, unused: int) -> str:
    """Where and why packing stopped, for ``RecallTrace.stopped``."""
    if not answered:
        return (f"relevance floor: no exchange reached min_relevance {floor:.2f} (best {best:.2f}); "
                "recent window only")
    if left > 0:
        return f"budget: {left} ranked candidates did not fit"
    if below:
        return (f"relevance floor: every candidate with relevance >= {keep:.2f} packed, {below} below it "
                f"left out; {unused} tokens unused")
    return f"candidates exhausted; {unused} tokens unused"


def _speaker_focus(ex: Exchange, asked: set[str]) -> frozenset[str] | None:
    """The participants of ``ex`` whose lines alone stand for it in the context, or None.

    In a chat between several people, whose messages carry OpenAI's ``name``, a question that
    names some of them ("What has Maria done to help her community?") is answered by their own
    lines: an exchange below the best ones adds what the named person said, and the other side
    of it mostly costs tokens. Such exchanges are rendered as the named participants' messages
    only (still verbatim, under their names), so the budget holds more of them; the best
    exchanges stay whole (``speaker_focus_share`` of the budget), as the context of the
    answer. Exchanges without a message by an asked participant, or with messages by asked
    participants only, stay whole. A name matches when one of its words is a query term
    ("Maria's" -> "maria") or starts with one of three letters or more ("Mel" -> Melanie).
    On the LoCoMo development split: +2 points of evidence recall at 2,048 tokens, multi-hop
    questions 0.71 -> 0.80 (docs/recall.md).
    """
    if not asked:
        return None
    present: set[str] = set()
    keep: set[str] = set()
    for msg in ex.messages:
        if not message_text(msg):
            continue
        who = speaker(msg)
        present.add(who.casefold())
        if isinstance(msg.get("name"), str) and _names(who, asked):
            keep.add(who.casefold())
    return frozenset(keep) if keep and keep < present else None


def _names(name: str, asked: set[str]) -> bool:
    """Whether the query terms name this participant: one of the name's words, or the start
    of one (three letters or more: "Mel" for Melanie, "Jon" for Jonathan)."""
    words = terms(name)
    return any(t == w or (len(t) >= 3 and w.startswith(t)) for t in asked for w in words)


def _short(path: tuple[str, ...]) -> tuple[str, ...]:
    """The last two levels of a path, each cut to its first keyword (headers cost tokens)."""
    return tuple(p.split(" · ")[0] for p in path[-2:])
