"""The read path: candidates from every index, scoring, packing, with a per-stage clock.

1. Analyse the query (terms, names, time window) and search the lexical indexes on a worker
   thread while the query is embedded once.
2. *indexes*: exchanges by dense and lexical search, topics by dense and lexical search.
3. *fuse*: the scoring stages of ``scoring.py`` that need only the candidates' heads: score
   fusion, topic relevance, the time window.
4. *expand*: the stages that read exchanges beyond the candidates' heads: exact terms,
   neighbours, coverage, feedback.
5. *pack*: the relevance floor, consolidation's marks, recent exchanges, greedy packing under
   the budget (``pack.py``); *render*: rendering and exactly counting the context.

``Recall.trace.timings_ms`` holds each stage's milliseconds (and ``embed``, ``total``), as
``arbormem bench`` reports them. docs/recall.md gives the measured worth of every step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar, cast

from ..config import RecallSettings
from ..embed.base import Embedder
from ..models import Exchange, Hit, Recall, RecallTrace, Topic
from ..organize.aliases import resolve_topic_hits
from ..organize.recall_hooks import linked_topics, recall_marks
from ..render import render_exchange
from ..store.base import ExchangeFilter, ExchangeHead, ExchangeText, Store
from ..tokens import TokenCounter
from . import scoring
from .pack import Packer, stopped
from .query import QueryAnalysis, analyse
from .reader import ExchangeReader
from .scoring import Candidate, rank_candidates
from .topics import TopicPaths

if TYPE_CHECKING:  # pragma: no cover
    from .llm_plan import RecallPlanner

_T = TypeVar("_T")
Hits = list[tuple[str, float]]
#: What a recall learns of its query before the vector: the time it is asked against and the
#: exchange count for IDF (``_now_and_size``), its analysis, its lexical hits (exchanges,
#: topics), and the texts of the best exchange hits.
QueryReads = tuple[datetime | None, int, QueryAnalysis, Hits, Hits, dict[str, ExchangeText]]
#: The best lexical hits whose texts are read alongside the embedding. Coverage and feedback
#: read the texts of the best ~80 of the fused ranking; on the two 10k bench memories 75% and
#: 67% of those are among the best 80 lexical hits (88% / 70% at 100, 96% / 78% at 200).
TEXTS_ALONGSIDE = 80


class _Alongside:
    """Runs the query's analysis and lexical searches on a worker thread while the caller
    embeds the query.

    They do not need its vector, and embedding it is the longest step of a recall (~10-15 ms
    for MiniLM on one core); the searches are mostly inside SQLite or PostgreSQL, outside the
    GIL, as is most of the model's work, so they finish while the embedding runs
    (BENCHMARKS.md, "Recall stages"). The analysis (one row read, a little Python) goes with
    them so the embedding starts at once. Bounded: when every worker is busy (many concurrent
    recalls) the work runs inline, as it did before."""

    def __init__(self, workers: int = 4) -> None:
        self.workers = workers
        self._free = threading.BoundedSemaphore(workers)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], _T]) -> Callable[[], _T]:
        """Start ``fn``; returns what waits for its result (or runs it, if no worker is free)."""
        if not self._free.acquire(blocking=False):
            return fn
        with self._lock:
            if self._pool is None:  # created on first use: no threads at import
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="arbormem-recall")
        try:
            future = self._pool.submit(fn)
        except RuntimeError:  # interpreter shutting down
            self._free.release()
            return fn
        future.add_done_callback(lambda _: self._free.release())
        return future.result


_ALONGSIDE = _Alongside()


class _Clock:
    """Milliseconds per stage of one recall: ``lap(stage)`` books the time since the last lap."""

    def __init__(self, timings: dict[str, float]) -> None:
        self.timings = timings
        self.last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.timings[stage] = self.timings.get(stage, 0.0) + (now - self.last) * 1000
        self.last = now


class Retriever:
    """Search and recall over one store with one embedder."""

    def __init__(self, store: Store, embedder: Embedder, counter: TokenCounter, settings: RecallSettings) -> None:
        self.store = store
        self.embedder = embedder
        self.counter = counter
        self.s = settings

    # -- shared candidate generation -------------------------------------------------------------
    def _score(self, reader: ExchangeReader, query: str, k: int, clock: _Clock, where: ExchangeFilter | None = None,
               ) -> tuple[dict[str, Candidate], dict[str, float], QueryAnalysis, datetime | None]:
        """Analyse and embed the query, search the four indexes, and return the live candidates
        with their scores (``scoring.py``, stage by stage), the topic relevance, the query's
        analysis and the time it was read against; ``reader`` holds every exchange read."""
        store, user_id, w = self.store, reader.user_id, self.s
        reads = self._query_reads(user_id, query, k, where, clock.timings)
        wait = _ALONGSIDE.submit(reads) if store.reads_alongside() else reads
        qvec = self.embedder.embed_one(query)
        clock.lap("embed")
        dense = store.vector_search(user_id, "exchange", qvec, k, where)
        # A merged topic keeps its parts' centroids as aliases (organize/consolidate.py) and
        # ranks as its best part; ranks count parts as topics (see resolve_topic_hits).
        tdense = [(tid, r) for tid, _, r in resolve_topic_hits(
            store.vector_search(user_id, "topic", qvec, scoring.TOPIC_DENSE_ROWS)) if r < scoring.TOPIC_RANKS]
        now, n_docs, q, lex, tlex, texts = wait()
        reader.keep_texts(texts)
        clock.lap("indexes")

        topic_norm = scoring.topic_relevance(
            tdense, tlex, lambda scores: linked_topics(store, user_id, scores, top=scoring.LINK_TOP))
        ranking = scoring.fuse(dense, lex, reader, w)
        scoring.lift_topics_and_time(ranking, topic_norm, q.time_range, q.names_day, w)
        clock.lap("fuse")

        scoring.lift_exact(ranking, q.terms, w, where)
        scoring.add_neighbours(ranking, w, where)
        if q.terms:  # the shares feed the relevance floor too (the weight may be 0)
            scoring.lift_coverage(ranking, q.terms, w)
        scoring.feedback(ranking, q.terms, n_docs, w)
        cands = scoring.candidates(ranking, dense, k, w)
        clock.lap("expand")
        return cands, topic_norm, q, now

    def _query_reads(self, user_id: str, query: str, k: int, where: ExchangeFilter | None,
                     timings: dict[str, float]) -> Callable[[], QueryReads]:
        """The query's analysis, lexical searches (exchanges, topics) and the texts of the
        best exchange hits as one call; their own durations go to ``timings["query"]`` and
        ``timings["lexical"]`` (they may overlap the embedding: see ``_Alongside``). Only
        reads go here, no tokenising: what overlaps the embedding for free is the work done
        outside the GIL (inside SQLite); Python work here slowed the embedding by as much as
        it took off after it (BENCHMARKS.md, "The whole bench on the merged main")."""
        def run() -> QueryReads:
            t0 = time.perf_counter()
            now, n_docs = self._now_and_size(user_id)
            q = analyse(query, now)
            t1 = time.perf_counter()
            timings["query"] = (t1 - t0) * 1000
            if not q.terms:
                return now, n_docs, q, [], [], {}
            lex = self.store.text_search(user_id, "exchange", q.terms, k, where)
            tlex = self.store.text_search(user_id, "topic", q.terms, scoring.TOPIC_RANKS)
            texts = self.store.exchange_texts(user_id, [i for i, _ in lex[:TEXTS_ALONGSIDE]]) if lex else {}
            timings["lexical"] = (time.perf_counter() - t1) * 1000
            return now, n_docs, q, lex, tlex, texts
        return run

    def _now_and_size(self, user_id: str) -> tuple[datetime | None, int]:
        """What a query is read against, from the user's newest exchange (one row): its time
        ("last week" counts back from it) and the exchange count for IDF (its sequence number
        + 1; deleted exchanges still count, which IDF does not mind)."""
        last = self.store.list_exchanges(user_id, status="completed", limit=1, newest_first=True)
        return (last[0].user_at, last[0].seq + 1) if last else (None, 1)

    # -- the relevance floor ------------------------------------------------------------------------
    def _floor(self, cands: dict[str, Candidate], min_relevance: float | None,
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

    def _marks(self, user_id: str, cands: dict[str, Candidate], exchanges: dict[str, Exchange | ExchangeHead],
               max_tokens: int, where: ExchangeFilter | None) -> None:
        """Consolidation marks (organize/consolidate.py): updates outrank the facts they
        superseded (both stay, rendered marked); pinned topics' latest exchanges come first.
        Heads carry the organiser's marks, which is all recall_marks reads of an exchange; it
        gets only the rows with metadata (a mark needs some), not every candidate to decode."""
        scores = {i: c.score for i, c in cands.items()}
        marked = {i: e for i, e in exchanges.items() if e.metadata}
        joins = recall_marks(self.store, user_id, scores, cast(dict[str, Exchange], marked), max_tokens,
                             lambda e: self.counter.count(render_exchange(e)) + 1)
        for i, source in joins.items():
            if i not in exchanges and i in marked:
                exchanges[i] = marked[i]
            ex = exchanges.get(i)
            if where and source == "pinned" and not (isinstance(ex, Exchange) and where.matches(ex)):
                scores.pop(i, None)
                continue
            cands.setdefault(i, Candidate(i)).sources.add(source)
        for i, s in scores.items():
            cands[i].score = s

    # -- public operations ------------------------------------------------------------------------
    def search(self, user_id: str, query: str, limit: int, where: ExchangeFilter | None = None,
               min_relevance: float | None = None) -> list[Hit]:
        reader = ExchangeReader(self.store, user_id)
        cands, *_ = self._score(reader, query, max(limit * 3, self.s.candidates), _Clock({}), where)
        self._floor(cands, min_relevance)
        ranked = rank_candidates(cands, reader.rows)[:limit]
        full = reader.full([c.ex_id for c in ranked])
        paths = TopicPaths(self.store, user_id).paths(t for c in ranked if (t := full[c.ex_id].topic_id))
        return [
            Hit(exchange=full[c.ex_id], score=c.score, topic_id=full[c.ex_id].topic_id,
                path=paths.get(full[c.ex_id].topic_id or "", ()), sources=tuple(sorted(c.sources)),
                relevance=round(c.relevance, 4))
            for c in ranked if c.ex_id in full
        ]

    def recall(self, user_id: str, query: str, max_tokens: int, recent: int,
               to_topic: Callable[[Topic, tuple[str, ...]], Topic],
               planner: RecallPlanner | None = None, where: ExchangeFilter | None = None,
               min_relevance: float | None = None) -> Recall:
        """The packed memory context; ``to_topic`` makes the public view of a packed topic
        from its head and title path. ``where`` restricts every candidate and the recent
        window; ``min_relevance`` overrides the setting (0: fill the budget)."""
        t_start = time.perf_counter()
        timings: dict[str, float] = {}
        clock = _Clock(timings)
        reader = ExchangeReader(self.store, user_id)
        exchanges = reader.rows
        cands, topic_norm, q, now = self._score(reader, query, self.s.candidates, clock, where)
        notes = list(q.notes)
        if planner is not None:  # the optional LLM step: at most one call (retrieve/llm_plan.py)
            before = set(cands)
            notes += planner.apply(self, user_id, query, now, cands, topic_norm, exchanges, q.time_range)
            if where:  # the planner reads the unfiltered tree: keep only what the filter admits
                new = [i for i in cands if i not in before]
                admitted = {e.id for e in self.store.get_exchanges(user_id, new) if where.matches(e)}
                for i in new:
                    if i not in admitted:
                        del cands[i]
            clock.lap("llm_plan")
        # The model's picks are its judgement: the per-exchange cut spares them (not the gate).
        picked = ({i for i, c in cands.items() if any(src.startswith("llm") for src in c.sources)}
                  if planner is not None else set())
        floor, best, below, answered = self._floor(cands, min_relevance, picked)

        self._marks(user_id, cands, exchanges, max_tokens, where)

        # Recent exchanges, within their share of the budget.
        recent_list: list[Exchange] = []
        if recent > 0:
            recent_list = list(reversed(self.store.list_exchanges(
                user_id, status="completed", limit=recent, newest_first=True, where=where)))
        tree = TopicPaths(self.store, user_id)
        asked = set(q.terms) if self.s.speaker_focus else set()
        packer = Packer(reader, self.counter, self.s, cands, tree, asked, max_tokens)
        packed, text, tokens, dropped, focused = packer.run(recent_list)
        if focused:
            notes.append("lines of " + ", ".join(sorted(focused)) + " only, below the best exchanges")
        why = stopped(floor, floor * self.s.floor_share, best, below, answered,
                      len(cands) - len([e for e in packed if e.id in cands]), max_tokens - tokens)
        clock.lap("pack")
        timings["pack"] -= packer.render_ms
        timings["render"] = packer.render_ms
        clock.last = time.perf_counter()
        topic_ids = [t for t in dict.fromkeys(e.topic_id for e in packed if e.topic_id)]
        topics = tuple(to_topic(rec, tree.path(tid)) for tid in topic_ids if (rec := tree.record(tid)) is not None)
        clock.lap("render")
        timings["total"] = (time.perf_counter() - t_start) * 1000
        trace = RecallTrace(
            query_terms=q.terms, candidates=len(cands),
            topic_scores={k: round(v, 4) for k, v in sorted(topic_norm.items(), key=lambda kv: -kv[1])[:10]},
            exchange_scores={e.id: round(cands[e.id].score, 6) for e in packed if e.id in cands},
            timings_ms={k: round(v, 2) for k, v in timings.items()}, budget=max_tokens,
            dropped=dropped, notes=tuple(notes), min_relevance=floor, best_relevance=round(best, 4),
            below_floor=below, stopped=why,
        )
        return Recall(text=text, tokens=tokens, exchanges=tuple(packed), topics=topics, trace=trace)
