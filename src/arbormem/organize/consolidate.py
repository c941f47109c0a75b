"""Consolidation: the organiser's clean-up pass over one user's tree (TRACE ``reorganize``,
CoMeT's consolidator), done so that nothing is lost, every change is logged and undoable, and
the cost grows about n log n.

One run (``consolidate``) does, per user:

1. **Merge** related frozen topics under TRACE's four axioms: the older topic absorbs the newer
   (chronological guard); only frozen leaves, never the open topic (frozen state); a cosine
   threshold between topic centroids calibrated for the embedder in use (``THRESHOLDS``,
   docs/consolidation.md); and a veto — the LLM when one is configured (``veto_merge``; no
   verdict keeps the topics apart), else an offline lexical/entity-overlap check, so "Python
   the snake" and "Python the language" stay apart. Candidates come from the store's nearest
   neighbour search (``vector_search``, k per topic), never from all pairs.
2. **Link** related topics that should not merge (similar but below the merge threshold, or
   vetoed), both ways, in topic ``meta.links``, at most ``max_links`` each.
3. **Archive** content-free exchanges ("ok", "thanks"): the ``archived`` flag, which retrieval
   already skips; the transcript keeps them; ``undo`` brings them back.
4. **Dedup** exchanges re-sent with the same content: the newer one is archived and linked to
   the older (``ExchangeMarks.duplicate_of``); never deleted, text never altered.
5. **Supersession**: a newer exchange that updates a fact ("actually, Sarah can eat nuts now")
   marks the older one ``superseded_by`` (and itself ``supersedes``); recall then prefers and
   marks the newer one and shows the older one as superseded (``rerank_superseded``).
6. **Tags**: each topic's tags (its keywords, or the LLM's retrieval terms) are normalised by
   meaning — a tag joins an existing tag when their embeddings are close, never by substring
   ("ai" does not swallow "email").

Structure after every merge is exact, in the same transaction as the change: the survivor's
span, size, centroid, term counts, title, keywords and summary, every ancestor's aggregates,
the topic vector and text indexes; emptied themes are removed; fan-out only shrinks; ids are
stable (the absorbed topic's exchanges take the survivor's id, the absorbed topic is kept
whole in the change log, and ``undo_change`` restores it with its own id).

LLM calls (the veto) are made with no transaction open; the writes happen afterwards in a
short transaction that first checks that both topics are unchanged.

The seams: ``thresholds.py`` (per embedder), ``heuristics.py`` (offline text judgements),
``veto.py`` (merge veto), ``aliases.py`` (a merged topic found by its parts), ``merge.py``
(merge / unmerge through ``TreeSession``'s mutation API), ``undo.py`` (undo, history),
``recall_hooks.py`` (what the marks change in a recall). This module holds the passes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import TreeSettings
from ..embed.base import Embedder
from ..models import Exchange
from ..store.base import Store, TopicRecord
from ..store.state import ExchangeMarks, RunMarks
from ..text import terms
from .aliases import alias_id
from .heuristics import is_trivial, names, near_duplicate_text, signature, update_cue
from .merge import merge_topics, set_links
from .models import ConsolidationReport
from .thresholds import Thresholds, thresholds_for
from .title_vectors import PhraseVectors, phrase_vectors
from .tree import TreeSession
from .veto import Veto, lexical_veto, llm_veto


@dataclass(frozen=True)
class ConsolidationOptions:
    """What a run may do and how much. Defaults are what ``Memory.consolidate`` uses."""

    thresholds: Thresholds | None = None    # None: thresholds_for(embedder.name)
    neighbours: int = 8                      # nearest topics examined per topic
    max_merges: int = 500
    max_llm_calls: int = 20                  # veto calls per run (the rest wait for a later run)
    max_merged_size: int | None = None       # None: 2 x TreeSettings.max_topic_size
    max_links: int = 4
    merge: bool = True
    link: bool = True
    archive: bool = True
    dedup: bool = True
    supersede: bool = True
    tags: bool = True
    short: bool = True                       # top-level strays join their branch (namesakes, short topics)
    batch: int = 200                         # exchanges per write transaction
    vector_scan: int = 200                   # newest new exchanges checked for near-duplicates



# -- the run -----------------------------------------------------------------------------------
@dataclass
class _Pair:
    older: TopicRecord
    newer: TopicRecord
    sim: float


def _state(store: Store, user_id: str) -> RunMarks:
    """The run's watermarks, kept on the root (``meta.consolidated``)."""
    roots = store.list_topics(user_id, parent_id=None)
    st = roots[0].meta.consolidated if roots else None
    return st if st is not None else RunMarks()


def _save_state(store: Store, user_id: str, *, topics: int | None = None, dirty: list[str] | None = None,
                exchanges: int | None = None) -> None:
    with store.transaction(user_id):
        roots = store.list_topics(user_id, parent_id=None)
        if not roots:
            return
        root = roots[0]
        st = root.meta.consolidated or RunMarks()
        if topics is not None:
            st.topics = topics
        if dirty is not None:
            st.dirty = dirty
        if exchanges is not None:
            st.exchanges = exchanges
        st.at = time.time()
        root.meta.consolidated = st
        store.put_topic(root)  # meta only: no label or index of the root changes


def _leaves(store: Store, user_id: str) -> tuple[TopicRecord | None, dict[str, TopicRecord]]:
    recs = store.list_topics(user_id)
    root = next((r for r in recs if r.kind == "root"), None)
    current = root.meta.current if root is not None else None
    leaves = {r.id: r for r in recs
              if r.kind == "topic" and r.frozen and r.id != current and r.size > 0 and r.vec_sum is not None}
    return root, leaves


def _older_first(a: TopicRecord, b: TopicRecord) -> tuple[TopicRecord, TopicRecord]:
    # TRACE's chronological guard: the topic that started first absorbs the later one.
    ka = (a.start_seq if a.start_seq is not None else 0, a.created_seq, a.id)
    kb = (b.start_seq if b.start_seq is not None else 0, b.created_seq, b.id)
    return (a, b) if ka <= kb else (b, a)


def candidate_pairs(store: Store, user_id: str, leaves: Mapping[str, TopicRecord], k: int,
                    floor: float, fresh: Iterable[str] | None = None) -> list[_Pair]:
    """Topic pairs at least ``floor`` similar, from k-nearest-neighbour search per topic
    (n searches of k: ~n log n with an ANN index, never all n^2 pairs). With ``fresh``, only
    those topics are searched from (pairs of two unchanged topics were judged before)."""
    seen: set[tuple[str, str]] = set()
    out: list[_Pair] = []
    sources = [leaves[i] for i in fresh if i in leaves] if fresh is not None else list(leaves.values())
    sources = [r for r in sources if r.centroid() is not None]
    if len(sources) > BATCH_KNN:
        neighbours = _batched_knn(sources, leaves, k)
    else:
        # Themes and merged topics' aliases share the topic index: ask for extra rows so k
        # leaves remain. Alias hits are skipped below (not in ``leaves``): merges are judged on
        # whole centroids, so a gradual drift cannot chain through one part at a time.
        extra = min(2 * k, sum(len(r.meta.aliases) for r in leaves.values()))
        neighbours = [store.vector_search(user_id, "topic", r.centroid(), 2 * k + 1 + extra)  # type: ignore[arg-type]
                      for r in sources]
    for rec, found in zip(sources, neighbours, strict=True):
        for tid, sim in found:
            if tid == rec.id or tid not in leaves or sim < floor or tid in rec.meta.no_merge:
                continue
            key = (min(tid, rec.id), max(tid, rec.id))
            if key in seen:
                continue
            seen.add(key)
            older, newer = _older_first(rec, leaves[tid])
            out.append(_Pair(older, newer, float(sim)))
    out.sort(key=lambda p: (-p.sim, p.older.id, p.newer.id))
    return out


#: Above this many topics to search from (a first run over an imported history), neighbours
#: are found with one blocked matrix product over the leaf centroids already in memory
#: instead of one index query each: the same exact k-NN, ~50x faster than per-query scans of
#: SQLite's exact index (each is memory-bound). Incremental runs search from few topics and use
#: the store's index (HNSW on PostgreSQL).
BATCH_KNN = 256


def _batched_knn(sources: Sequence[TopicRecord], leaves: Mapping[str, TopicRecord], k: int,
                 block: int = 512) -> list[list[tuple[str, float]]]:
    ids = list(leaves)
    mat = np.stack([leaves[i].centroid() for i in ids])  # type: ignore[misc]
    q = np.stack([r.centroid() for r in sources])  # type: ignore[misc]
    kk = min(k + 1, len(ids))
    out: list[list[tuple[str, float]]] = []
    for start in range(0, len(q), block):
        sims = q[start : start + block] @ mat.T
        top = np.argpartition(-sims, kk - 1, axis=1)[:, :kk]
        for row, cols in zip(sims, top, strict=True):
            cols = cols[np.argsort(-row[cols])]
            out.append([(ids[j], float(row[j])) for j in cols])
    return out


def consolidate(
    store: Store,
    embedder: Embedder,
    user_id: str,
    settings: TreeSettings,
    *,
    llm: Any = None,
    options: ConsolidationOptions | None = None,
    phrases: PhraseVectors | None = None,
) -> ConsolidationReport:
    """Consolidate one user's memory (see the module docstring); returns what was done.

    ``llm`` is an optional ``LLMRunner`` used for the merge veto. Safe to run while the user
    keeps writing: decisions are re-checked inside each short write transaction. Each pass
    keeps a watermark, so a later run looks only at what changed since. ``phrases``: the
    memory's titling aid (``Writer.phrases``; by default one made for ``embedder``), so
    themes retitled here are titled as placement titles them.
    """
    opts = options or ConsolidationOptions()
    phrases = phrases or phrase_vectors(embedder, settings)
    thr = opts.thresholds or thresholds_for(getattr(embedder, "name", ""))
    t0 = time.perf_counter()
    calls_before = llm.total_calls if llm is not None else 0
    counts: dict[str, int] = dict.fromkeys(
        ("candidates", "merged", "linked", "archived", "superseded", "deduplicated", "tagged", "rehomed", "skipped",
         "vetoed"), 0)
    changes: list[str] = []
    notes: list[str] = []
    newest = store.list_exchanges(user_id, limit=1, newest_first=True)
    high = newest[0].seq if newest else 0
    st = _state(store, user_id)

    if opts.merge or opts.link:
        again = _merge_and_link(store, user_id, settings, llm, opts, thr, counts, changes, st, phrases)
        _save_state(store, user_id, topics=high, dirty=sorted(again))
    if opts.short:
        _short_pass(store, user_id, settings, counts, changes, phrases)
    if opts.archive or opts.dedup or opts.supersede:
        _exchanges_pass(store, user_id, opts, thr, counts, changes, st.exchanges)
        _save_state(store, user_id, exchanges=high)
    if opts.tags:
        _tags_pass(store, embedder, user_id, thr, counts)

    return ConsolidationReport(
        user_id=user_id, **counts,
        llm_calls=(llm.total_calls - calls_before) if llm is not None else 0,
        duration=time.perf_counter() - t0, changes=tuple(changes), notes=tuple(notes),
    )


# Long: judge the candidate pairs without a transaction (LLM calls), then apply them in
# one short transaction that re-checks each; the two halves share the decisions.
def _merge_and_link(store: Store, user_id: str, settings: TreeSettings, llm: Any, opts: ConsolidationOptions,
                    thr: Thresholds, counts: dict[str, int], changes: list[str], st: RunMarks,
                    phrases: PhraseVectors | None = None) -> set[str]:
    """Returns the topics the next run must look at again (survivors, postponed pairs)."""
    _, leaves = _leaves(store, user_id)
    if len(leaves) < 2:
        return set()
    mark = st.topics
    fresh = None
    if mark:
        # Topics that changed since the last run: grew past its watermark, or were touched.
        fresh = {i for i, r in leaves.items() if (r.end_seq or 0) > mark} | set(st.dirty)
    floor = thr.link if opts.link else thr.merge
    pairs = candidate_pairs(store, user_id, leaves, opts.neighbours, floor, fresh)
    counts["candidates"] = len(pairs)
    max_size = opts.max_merged_size or 2 * settings.max_topic_size
    used: set[str] = set()
    again: set[str] = set()
    merges: list[tuple[_Pair, Veto]] = []
    links: list[tuple[_Pair, str]] = []
    n_docs = max(1, sum(r.size for r in leaves.values()))
    df: dict[str, int] = {}
    texts: dict[str, list[Exchange]] = {}

    def members(tid: str) -> list[Exchange]:
        if tid not in texts:
            texts[tid] = store.list_exchanges(user_id, topic_id=tid, status="completed")
        return texts[tid]

    llm_budget = opts.max_llm_calls
    for p in pairs:
        if opts.merge and p.sim >= thr.merge:
            # One merge per topic per run: a chain a<-b<-c is finished by the next run, with
            # fresh centroids, instead of judged against a topic that is changing.
            if p.older.id in used or p.newer.id in used or len(merges) >= opts.max_merges:
                again.update({p.older.id, p.newer.id})
                continue
            if p.older.size + p.newer.size > max_size:
                counts["skipped"] += 1
                links.append((p, "too large to merge"))
                continue
            if llm is not None:
                if llm_budget <= 0:
                    counts["skipped"] += 1
                    again.update({p.older.id, p.newer.id})
                    continue
                llm_budget -= 1
                verdict = llm_veto(llm, p.older, p.newer, members(p.older.id), members(p.newer.id))
            else:
                need = [t for t in {*p.older.terms, *p.newer.terms} if t not in df]
                if need:
                    df.update(store.get_term_df(user_id, need))
                # Terms first (from the topic rows); the texts, for names, only if they pass.
                verdict = lexical_veto(p.older, p.newer, [], [], df, n_docs)
                if verdict.ok:
                    verdict = lexical_veto(p.older, p.newer, [e.text for e in members(p.older.id)],
                                           [e.text for e in members(p.newer.id)], df, n_docs)
            if verdict.ok:
                used.update({p.older.id, p.newer.id})
                merges.append((p, verdict))
            else:
                counts["vetoed"] += 1
                links.append((p, f"vetoed by {verdict.by}"))
        elif opts.link and p.sim < thr.merge:
            links.append((p, "similar"))
    if not merges and not (opts.link and links):
        return again
    with store.transaction(user_id):
        tree = TreeSession(store, user_id, settings, phrases=phrases)
        current = tree.root.meta.current
        touched: list[TopicRecord] = []
        # Absorbed topics that were survivors hand their parts over: their alias vectors in one
        # query (SQLite answers each such lookup in ~10 ms at 10k topics, one per merge added up).
        # One merge per topic per run, so no merge of this batch changes them.
        want = [alias_id(p.newer.id, part) for p, _ in merges for part in p.newer.meta.aliases]
        alias_vectors = store.get_vectors(user_id, "topic", want) if want else {}
        for p, verdict in merges:
            a, b = tree.get(p.older.id), tree.get(p.newer.id)
            # Re-check inside the transaction: the user may have written while the LLM thought.
            if (a is None or b is None or not a.frozen or not b.frozen or current in (a.id, b.id)
                    or a.size != p.older.size or b.size != p.newer.size):
                counts["skipped"] += 1
                continue
            detail = merge_topics(store, tree, a, b, defer=touched, alias_vectors=alias_vectors)
            detail.update({"similarity": round(p.sim, 4), "threshold": thr.merge,
                           "veto": {"by": verdict.by, **verdict.detail},
                           "reason": "older topic absorbs a newer one on the same subject"})
            changes.append(store.log_change(user_id, "merge", b.id, detail))
            counts["merged"] += 1
            again.add(a.id)
        tree.refresh(touched)
        meta_only: set[str] = set()
        if opts.link:
            for p, why in links:
                a, b = tree.get(p.older.id), tree.get(p.newer.id)
                if a is None or b is None or b.id in a.meta.links:
                    continue
                if len(a.meta.links) >= opts.max_links or len(b.meta.links) >= opts.max_links:
                    continue
                set_links(a, [*a.meta.links, b.id])
                set_links(b, [*b.meta.links, a.id])
                meta_only.update({a.id, b.id})
                changes.append(store.log_change(user_id, "link", a.id, {
                    "a": a.id, "b": b.id, "similarity": round(p.sim, 4), "threshold": thr.link, "reason": why}))
                counts["linked"] += 1
        written = set(tree.flush())
        # Links are metadata: no label, centroid or index entry changes, so write rows only.
        for tid in meta_only - written:
            node = tree.get(tid)
            if node is not None:
                store.put_topic(node)
    return again



def _short_pass(store: Store, user_id: str, settings: TreeSettings, counts: dict[str, int],
                changes: list[str], phrases: PhraseVectors | None = None) -> None:
    """Top-level strays go home: a node titled as a bigger top-level branch joins it when no
    less related than any two exchanges (``TreeSession.home_namesake``); two related top-level
    branches join (``join_related``); a closed topic under a theme moves to the branch it
    relates to better, or to the top level when it relates to nothing (``rehome_topics``;
    docs/tree.md, "Misplaced topics"); then each closed topic (or small theme) of at most
    ``small_topic`` exchanges alone at the top level joins the bigger branch it relates to
    clearly best (``TreeSession.home_short``; docs/tree.md, "Short returns"). Runs on the
    grown tree, after merging; the top level is bounded (``root_children``) and the topics
    are read as shapes, so the pass reads little. Each move is logged and undoable."""
    with store.transaction(user_id):
        # Each move changes what a branch relates to, and the flush retitles the branches a
        # namesake is judged by: the steps run again over the new tree until they move nothing
        # (at most ``_SHORT_ROUNDS`` times), so a second consolidation run finds nothing to do
        # (on the subject histories one round left a move for the next run in 3 of 29).
        for _ in range(_SHORT_ROUNDS):
            tree = TreeSession(store, user_id, settings, phrases=phrases)
            before = counts["rehomed"]
            _short_steps(tree, store, user_id, counts, changes)
            tree.flush()
            if counts["rehomed"] == before:
                break
        # Titled again only at those flushes: the moves may have given two top-level branches
        # one title, so the namesakes are told apart over the new titles.
        tree = TreeSession(store, user_id, settings, phrases=phrases)
        if tree.distinguish_namesakes():
            tree.flush()


#: Rounds of the short pass's steps in one consolidation run (each round after the first runs
#: only when the one before moved something).
_SHORT_ROUNDS = 3


def _short_steps(tree: TreeSession, store: Store, user_id: str, counts: dict[str, int], changes: list[str]) -> None:
    """One round of the short pass's steps over ``tree`` (see ``_short_pass``)."""
    current = tree.root.meta.current

    def log(node: TopicRecord, parent: TopicRecord, link: float, at: float, why: str,
            old: TopicRecord | None = None) -> None:
        changes.append(store.log_change(user_id, "rehome", node.id, {
            "from": (old or tree.root).id, "to": parent.id, "link": round(link, 4),
            "threshold": round(at, 4), "reason": why}))
        counts["rehomed"] += 1

    def each(step: Callable[[TopicRecord], tuple[TopicRecord, float, float] | None], why: str) -> None:
        # (Each step leaves a node this pass moved already alone: it is no longer at the top.)
        for node in [c for c in tree.children(tree.root) if c.frozen and c.id != current and not c.meta.stays]:
            moved = step(node)
            if moved is not None:
                parent, link, at = moved
                log(node, parent, link, at, why)

    each(tree.home_namesake, "titled as a bigger top-level branch and no less related than any two exchanges")
    for node, parent, score, at in tree.join_related():
        log(node, parent, score, at, "related to a bigger top-level branch by vectors and shared words")
    for node, old, parent, link, at in tree.rehome_topics():
        log(node, parent, link, at, "relates to another branch better than to its own" if parent.id != tree.root.id
            else "relates to nothing in its branch", old)
    each(tree.home_short, "a short topic alone at the top level joins the branch it relates to")


# Long: plan (archive, dedup, supersede) over batches without a transaction, then apply the
# plans in short transactions that re-check each exchange.
def _exchanges_pass(store: Store, user_id: str, opts: ConsolidationOptions, thr: Thresholds,
                    counts: dict[str, int], changes: list[str], mark: int) -> None:
    """Archive, dedup and supersession over the exchanges added since the last run.

    Duplicates: the same words re-sent (``signature``, one pass over the transcript, O(n)),
    plus near-duplicates (cosine >= ``thresholds.duplicate`` and word Jaccard >= 0.9) among the
    newest ``vector_scan`` new exchanges, looked up in the vector index. Supersession: new
    exchanges with a correction cue, looked up in the vector index.
    """
    pending = store.list_exchanges(user_id, status="completed", after_seq=mark)
    if not pending:
        return
    first: dict[str, Exchange] = {}
    if opts.dedup:
        for e in store.iter_exchanges(user_id):
            if e.status == "completed" and e.seq <= mark and not e.archived:
                first.setdefault(signature(e.text), e)
    scan_from = pending[-opts.vector_scan].seq if len(pending) > opts.vector_scan else pending[0].seq
    n_docs = max(1, sum(store.count_exchanges(user_id).values()))
    df_cache: dict[str, int] = {}

    def df_of(term: str) -> int:
        if term not in df_cache:
            df_cache.update({term: 0, **store.get_term_df(user_id, [term])})
        return df_cache[term]

    plans: list[tuple[str, Exchange, dict[str, Any]]] = []
    for start in range(0, len(pending), opts.batch):
        chunk = pending[start : start + opts.batch]
        searched: dict[str, list[tuple[str, float]]] = {}
        want = [e for e in chunk if not e.archived and not (opts.archive and is_trivial(e))
                and ((opts.dedup and e.seq >= scan_from) or (opts.supersede and update_cue(e.user_text)))]
        vecs = store.get_vectors(user_id, "exchange", [e.id for e in want]) if want else {}
        for e in want:
            if e.id in vecs:
                hits = [(i, s) for i, s in store.vector_search(user_id, "exchange", vecs[e.id], 6) if i != e.id]
                searched[e.id] = [(i, s) for i, s in hits
                                  if s >= thr.duplicate or (s >= thr.supersede and update_cue(e.user_text))]
        near = {x.id: x for x in store.get_exchanges(user_id, sorted({i for h in searched.values() for i, _ in h}))}
        for ex in chunk:
            if ex.archived:
                continue
            if opts.archive and is_trivial(ex):
                plans.append(("archive", ex, {"reason": "trivial", "words": len(ex.text.split())}))
                continue
            if opts.dedup:
                sig = signature(ex.text)
                orig = first.get(sig)
                if orig is not None and orig.seq < ex.seq:
                    plans.append(("dedup", ex, {"of": orig.id, "match": "same words"}))
                    continue
                first.setdefault(sig, ex)
                dup = next((near[i] for i, s in searched.get(ex.id, ()) if i in near and s >= thr.duplicate
                            and near[i].seq < ex.seq and not near[i].archived
                            and near_duplicate_text(near[i].text, ex.text)), None)
                if dup is not None:
                    plans.append(("dedup", ex, {"of": dup.id, "match": "near"}))
                    continue
            if not opts.supersede or not update_cue(ex.user_text):
                continue
            mine = names(ex.user_text) | set(terms(ex.user_text))
            for oid, sim in searched.get(ex.id, ()):
                o = near.get(oid)
                if o is None or o.seq >= ex.seq or sim < thr.supersede or o.archived or ExchangeMarks.of(o.metadata).superseded_by:
                    continue
                shared_names = names(o.text) & names(ex.user_text)
                shared_terms = (set(terms(o.text)) & mine) - {"actually", "anymore"}
                # The shared evidence must be specific: terms in most exchanges (the speakers'
                # names in a dialogue, "family", "life") say nothing about one fact.
                rare = {t for t in shared_terms if df_of(t) <= max(2, 0.05 * n_docs)}
                if shared_names and len(rare) >= 2:
                    plans.append(("supersede", o, {"by": ex.id, "similarity": round(sim, 4),
                                                   "shared": sorted(rare)[:8]}))
                    break
    for start in range(0, len(plans), opts.batch):
        with store.transaction(user_id):
            for action, ex, detail in plans[start : start + opts.batch]:
                cur = store.get_exchange(ex.id)
                if cur is None or cur.status != "completed":
                    continue
                if action == "archive" and not cur.archived:
                    store.update_exchange(dataclasses.replace(cur, archived=True))
                    counts["archived"] += 1
                elif action == "dedup" and not cur.archived:
                    marks = dataclasses.replace(ExchangeMarks.of(cur.metadata), duplicate_of=detail["of"])
                    store.update_exchange(dataclasses.replace(cur, metadata=marks.apply(cur.metadata), archived=True))
                    counts["deduplicated"] += 1
                elif action == "supersede" and not ExchangeMarks.of(cur.metadata).superseded_by:
                    newer = store.get_exchange(detail["by"])
                    if newer is None:
                        continue
                    marks = dataclasses.replace(ExchangeMarks.of(cur.metadata), superseded_by=newer.id)
                    store.update_exchange(dataclasses.replace(cur, metadata=marks.apply(cur.metadata)))
                    nm = ExchangeMarks.of(newer.metadata)
                    nm = dataclasses.replace(nm, supersedes=(*nm.supersedes, cur.id))
                    store.update_exchange(dataclasses.replace(newer, metadata=nm.apply(newer.metadata)))
                    counts["superseded"] += 1
                else:
                    continue
                changes.append(store.log_change(user_id, action, ex.id, detail))


def _topic_tags(rec: TopicRecord) -> list[str]:
    raw = rec.meta.retrieval_terms if rec.meta.label_source == "llm" else None
    words = [str(t) for t in (raw or rec.keywords)][:6]
    # Numbers and codes are not tags (and would make every topic's tags unique).
    return [" ".join(w.casefold().split()) for w in words if any(ch.isalpha() for ch in w)]


def normalise_tags(tags: Sequence[str], vocab: Sequence[str], embed: Any, threshold: float,
                   block: int = 256) -> dict[str, str]:
    """Map each tag to a canonical tag: itself (exact match or new) or the closest known tag
    when their embeddings are at least ``threshold`` similar. Meaning, never substrings.

    Tags are taken in order; each one not joined becomes known for the ones after it. The
    similarities are computed a block of tags at a time (matrix products), so only the greedy
    choice itself is sequential."""
    known = list(dict.fromkeys(vocab))
    known_set = set(known)
    todo = [t for t in dict.fromkeys(tags) if t not in known_set]
    out = {t: t for t in tags if t in known_set}
    if not todo:
        return out
    vecs = np.asarray(embed([*known, *todo]), dtype=np.float32)
    mat = np.zeros((len(known) + len(todo), vecs.shape[1]), dtype=np.float32)
    mat[: len(known)] = vecs[: len(known)]
    names_ = list(known)
    n = len(known)
    for start in range(0, len(todo), block):
        chunk = todo[start : start + block]
        q = vecs[len(known) + start : len(known) + start + len(chunk)]
        before = mat[:n] @ q.T if n else np.zeros((0, len(chunk)), dtype=np.float32)  # (n, b)
        base_n = n
        inside = q @ q.T                                                                # (b, b)
        accepted: list[int] = []  # positions in this chunk that became known tags
        for j, tag in enumerate(chunk):
            best_sim, best = -2.0, -1
            if base_n:
                b = int(np.argmax(before[:, j]))
                best_sim, best = float(before[b, j]), b
            if accepted:
                sims = inside[accepted, j]
                a = int(np.argmax(sims))
                if float(sims[a]) > best_sim:
                    best_sim, best = float(sims[a]), base_n + a
            if best >= 0 and best_sim >= threshold:
                out[tag] = names_[best]
                continue
            out[tag] = tag
            mat[n] = q[j]
            names_.append(tag)
            accepted.append(j)
            n += 1
    return out


def _tags_pass(store: Store, embedder: Embedder, user_id: str, thr: Thresholds, counts: dict[str, int]) -> None:
    _, leaves = _leaves(store, user_id)
    stale = [r for r in leaves.values() if r.meta.tags_size != r.size]
    if not stale:
        return
    freq: dict[str, int] = {}
    for r in leaves.values():
        if r.meta.tags_size == r.size:
            for t in r.meta.tags:
                freq[t] = freq.get(t, 0) + 1
    vocab = [t for t, _ in sorted(freq.items(), key=lambda kv: -kv[1])[:2000]]
    raw = {r.id: _topic_tags(r) for r in stale}
    mapping = normalise_tags([t for ts in raw.values() for t in ts], vocab, embedder.embed, thr.tag)
    with store.transaction(user_id):
        for r in stale:
            node = store.get_topic(r.id)
            if node is None or node.size != r.size:
                continue
            node.meta.tags = list(dict.fromkeys(mapping.get(t, t) for t in raw[r.id]))
            node.meta.tags_size = node.size
            store.put_topic(node)  # tags are metadata: no label or index changes
            counts["tagged"] += 1



__all__ = ["ConsolidationOptions", "ConsolidationReport", "candidate_pairs", "consolidate", "normalise_tags"]
