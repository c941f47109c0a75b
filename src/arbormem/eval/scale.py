"""Scale benchmark: recall latency over one user partition of 10k / 100k / 1M exchanges.

Ingest through the full pipeline (``Memory.add_many``: embed, place, index, one exchange at a
time) runs at ~120-180 exchanges/s even with the hash embedder, so a million exchanges would
take hours. ``bulk_load`` writes what the pipeline would have written, directly:

* exchanges (chat-like texts about many synthetic subjects, 12 per session, several sessions
  a day), their lexical keys (own text plus the same-session neighbours', as
  ``Memory._reindex_text``), their vectors and the user's term document frequencies;
* the topic tree: leaves are runs of consecutive exchanges on one subject in one session (at
  most ``max_topic_size``), grouped into bottom themes per subject and upper themes until the
  root has at most ``max_children`` children, every leaf at the same depth as the B-tree
  placement keeps it; each node with its vector sum, bounded term counts, keywords, title and
  extractive summary made by the same helpers as ``organize/tree.py``; topic vectors
  (centroids) and topic lexical entries.

Vectors are synthesised, not embedded: each subject has a random unit centre; an exchange's
vector is its subject's centre plus Gaussian noise (cosine ~0.7 to the centre, ~0.5 between two
exchanges of a subject, ~0 across subjects). ``SubjectEmbedder`` embeds any text the same way
(the centres of the subjects whose words it names, plus noise seeded by the text), so a
query's dense and lexical candidates both point at the exchanges it was made from: the queries
have real answers, and ``answer_rate`` (the share of recalls that packed the exchange a query
was made from) shows it.

Writes go through the Store contract (``insert_exchange``, ``put_vectors``, ``put_text``,
``put_topic``, ``add_term_df``) in large transactions, except on PostgreSQL, where the rows of
exchanges and topics, their text entries (tsvectors made by the store's own tokenizer) and all
vectors are COPYed in (per-row round trips plus per-row HNSW inserts would take hours at 1M)
and the HNSW index is then built once, by the store's own ``put_vectors`` creating it over the
loaded rows. Term statistics go through the contract on both.

Then ``Memory.recall`` — the real read path — is timed on a freshly opened store, and on
PostgreSQL also from ``clients`` concurrent processes.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np

from ..embed.base import Embedder
from ..errors import ConfigError
from ..models import Exchange, Serializable
from ..store.base import Store, TopicRecord
from ..store.state import TopicMeta
from .bench import _ASSIST_T, _NAMES, _USER_T, _db_bytes, _pcts

STORES = ("sqlite", "postgres")
SESSION = 12          # exchanges per session
SESSIONS_PER_DAY = 8
SIGMA = 1.0           # noise norm relative to the unit centre: cos(vector, centre) ~ 0.71
SUBJECT_WORDS = 10
THEME_FANOUT = 6      # children per theme: B-tree nodes hold max_children/2..max_children
_SYL = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
_TOKEN = re.compile(r"[^\W_]+", re.UNICODE)


def subjects_for(size: int) -> int:
    """Distinct subjects in a history of ``size`` exchanges: grows like sqrt(size) (Heaps'
    law): 500 at 10k, 1,581 at 100k, 5,000 at 1M; each recurs ~size/subjects times."""
    return max(32, int(5 * size**0.5))


class World:
    """The subjects of a synthetic history: words and vector centres, from (size, dim, seed)."""

    def __init__(self, size: int, dim: int = 384, seed: int = 7) -> None:
        self.size, self.dim, self.seed = size, dim, seed
        rng = random.Random(seed)
        n = subjects_for(size)
        used: set[str] = set()
        self.words: list[list[str]] = []
        for _ in range(n):
            ws: list[str] = []
            while len(ws) < SUBJECT_WORDS:
                w = "".join(rng.choice(_SYL) for _ in range(3))
                if w not in used:
                    used.add(w)
                    ws.append(w)
            self.words.append(ws)
        self.word_subject = {w: s for s, ws in enumerate(self.words) for w in ws}
        c = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
        self.centres = c / np.linalg.norm(c, axis=1, keepdims=True)

    @property
    def subjects(self) -> int:
        return len(self.words)

    def vectors(self, subjects: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Unit vectors of exchanges on ``subjects`` (one row each)."""
        noise = rng.normal(size=(len(subjects), self.dim)).astype(np.float32) * (SIGMA / self.dim**0.5)
        m = self.centres[subjects] + noise
        return m / np.linalg.norm(m, axis=1, keepdims=True)


class SubjectEmbedder(Embedder):
    """Embeds a text into the synthetic subject space: the mean centre of the subjects its words
    name plus noise seeded by the text (deterministic); a text naming none gets a random unit
    vector. A real Embedder (no model), consistent with the vectors ``bulk_load`` writes."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.name = f"synthetic-subjects-{world.subjects}-seed{world.seed}"

    @property
    def dim(self) -> int:
        return self.world.dim

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        w = self.world
        out = np.empty((len(texts), w.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            seed = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")
            rng = np.random.default_rng(seed)
            hits = Counter(s for t in _TOKEN.findall(text.lower()) if (s := w.word_subject.get(t)) is not None)
            noise = rng.normal(size=w.dim).astype(np.float32) * (SIGMA / w.dim**0.5)
            if hits:
                centre = sum(w.centres[s] * c for s, c in hits.items()) / sum(hits.values())
                out[i] = centre + noise
            else:
                out[i] = noise
        return out


# -- the synthetic history --------------------------------------------------------------------

@dataclass
class History:
    """``size`` exchanges of one user, in sequence order (index i = seq i + 1)."""

    ids: list[str]
    user_texts: list[str]
    assistant_texts: list[str]
    subjects: np.ndarray
    sessions: list[str]
    times: list[datetime]
    queries: list[tuple[str, int]]  # (query text, index of the exchange it was made from)

    def text(self, i: int) -> str:
        return f"{self.user_texts[i]}\n{self.assistant_texts[i]}"

    def __len__(self) -> int:
        return len(self.ids)


def synthesise(world: World, size: int, n_queries: int = 2000, seed: int = 7) -> History:
    """The history: a subject held for a few exchanges (p=1/6 of a change per exchange, and
    at every new session with p=1/2), templates filled with the subject's words and a name."""
    rng = random.Random(seed + 1)
    end = datetime(2026, 11, 1, 9, 0, tzinfo=timezone.utc)
    days = -(-size // (SESSION * SESSIONS_PER_DAY))
    start = end - timedelta(days=days)
    targets = set(rng.sample(range(size), min(n_queries, size)))
    ids, users, assistants, sessions, times = [], [], [], [], []
    subjects = np.empty(size, dtype=np.int64)
    queries: list[tuple[str, int]] = []
    subject = rng.randrange(world.subjects)
    periods = ("week", "weekend", "month", "morning")
    for i in range(size):
        new_session = i % SESSION == 0
        if (new_session and rng.random() < 0.5) or rng.random() < 1 / 6:
            subject = rng.randrange(world.subjects)
        words = world.words[subject]
        fill = {"a": rng.choice(words), "b": rng.choice(words), "c": rng.choice(words),
                "n": rng.choice(_NAMES), "d": rng.choice(periods)}
        users.append(rng.choice(_USER_T).format(**fill))
        assistants.append(rng.choice(_ASSIST_T).format(**fill))
        subjects[i] = subject
        k = i // SESSION
        sessions.append(f"s{k}")
        times.append(start + timedelta(days=k // SESSIONS_PER_DAY, minutes=90 * (k % SESSIONS_PER_DAY) + 5 * (i % SESSION)))
        ids.append(f"x_{rng.getrandbits(128):032x}")
        if i in targets:
            queries.append((f"What did {fill['n']} say about {fill['a']} and {fill['b']}?", i))
    rng.shuffle(queries)
    return History(ids, users, assistants, subjects, sessions, times, queries)


def lexical_key(h: History, i: int) -> str:
    """The exchange's lexical index text, as ``Memory._reindex_text`` writes it."""
    parts = [h.text(i)]
    for j in (i - 1, i + 1):
        if 0 <= j < len(h) and h.sessions[j] == h.sessions[i]:
            parts.append(h.text(j))
    return "\n".join(parts)


# -- the topic tree ---------------------------------------------------------------------------

def _leaf_summary(h: History, lo: int, hi: int, keywords: list[str], df: dict[str, int], n: int) -> str:
    """``TreeSession._extractive_summary``: the two sentences richest in the keywords."""
    from ..text import idf, sentences, shorten, terms

    weights = {t: idf(df.get(t, 1), n) for t in keywords}
    best: list[tuple[float, int, str]] = []
    order = 0
    for i in range(lo, hi):
        for sent in sentences(h.user_texts[i]) + sentences(h.assistant_texts[i]):
            toks = set(terms(sent))
            best.append((sum(w for t, w in weights.items() if t in toks) / (1.0 + 0.02 * len(sent)), order, sent))
            order += 1
    top = sorted(best, key=lambda b: -b[0])[:2]
    text = " ".join(s for _, _, s in sorted(top, key=lambda b: b[1]))
    return shorten(text, 240)


def build_tree(h: History, vecs: np.ndarray, counts: list[Counter[str]], df: dict[str, int], user_id: str,
               max_topic_size: int = 24, max_children: int = 8, seed: int = 7) -> tuple[list[TopicRecord], list[str]]:
    """Every node of the user's tree (root first) and each exchange's leaf id."""
    from ..organize.tree import KEYWORDS, LEAF_TERMS, THEME_TERMS, keyword_title
    from ..text import merge_counts, prune_counts, shorten, top_terms

    rng = random.Random(seed + 2)
    n = len(h)

    def new_id(prefix: str) -> str:
        return f"{prefix}_{rng.getrandbits(128):032x}"

    # Leaves: runs of one subject within one session, cut at max_topic_size.
    starts = [0]
    for i in range(1, n):
        if (h.subjects[i] != h.subjects[i - 1] or h.sessions[i] != h.sessions[i - 1]
                or i - starts[-1] >= max_topic_size):
            starts.append(i)
    bounds = list(zip(starts, [*starts[1:], n], strict=True))
    sums = np.add.reduceat(vecs, starts, axis=0).astype(np.float32)
    leaf_of = [""] * n
    leaves: list[TopicRecord] = []
    leaf_subject: dict[str, int] = {}
    for (lo, hi), vsum in zip(bounds, sums, strict=True):
        acc: dict[str, int] = {}
        for i in range(lo, hi):
            acc = merge_counts(acc, counts[i].items())
        rec = TopicRecord(
            id=new_id("t"), user_id=user_id, kind="topic", parent_id=None, summary="",
            start_seq=lo + 1, end_seq=hi, size=hi - lo, first_at=h.times[lo], last_at=h.times[hi - 1],
            frozen=True, vec_sum=vsum, terms=prune_counts(acc, LEAF_TERMS), created_seq=lo + 1,
            meta=TopicMeta(session=h.sessions[lo]),
        )
        rec.keywords = top_terms(rec.terms, df, n, KEYWORDS)
        rec.title = keyword_title(rec.keywords)
        rec.summary = _leaf_summary(h, lo, hi, rec.keywords, df, n)
        leaves.append(rec)
        leaf_subject[rec.id] = int(h.subjects[lo])
        for i in range(lo, hi):
            leaf_of[i] = rec.id
    last = leaves[-1]  # the open topic: not frozen, summary = its first user message
    last.frozen = False
    last.summary = shorten(h.user_texts[(last.start_seq or 1) - 1], 200)

    def theme_over(kids: list[TopicRecord]) -> TopicRecord:
        acc: dict[str, int] = {}
        for k in kids:
            acc = merge_counts(acc, k.terms.items())
        t = TopicRecord(
            id=new_id("t"), user_id=user_id, kind="theme", parent_id=None,
            start_seq=min(k.start_seq or 0 for k in kids), end_seq=max(k.end_seq or 0 for k in kids),
            size=sum(k.size for k in kids), first_at=min(k.first_at for k in kids if k.first_at),
            last_at=max(k.last_at for k in kids if k.last_at), frozen=all(k.frozen for k in kids),
            vec_sum=np.sum([k.vec_sum for k in kids if k.vec_sum is not None], axis=0).astype(np.float32),
            terms=prune_counts(acc, THEME_TERMS), created_seq=min(k.created_seq for k in kids),
        )
        t.keywords = top_terms(t.terms, df, n, KEYWORDS)
        t.title = keyword_title(t.keywords)
        t.summary = shorten("; ".join(k.title for k in kids if k.title), 240)
        for k in kids:
            k.parent_id = t.id
        leaf_subject[t.id] = leaf_subject[kids[0].id]
        return t

    # Bottom themes: a subject's leaves in time order, THEME_FANOUT at a time (placement
    # descends into the most similar theme, so one subject's topics gather under its themes).
    by_subject: dict[int, list[TopicRecord]] = {}
    for leaf in leaves:
        by_subject.setdefault(leaf_subject[leaf.id], []).append(leaf)
    level = [theme_over(ls[j : j + THEME_FANOUT]) for ls in by_subject.values()
             for j in range(0, len(ls), THEME_FANOUT)]
    themes = list(level)
    while len(level) > max_children:  # upper levels until the root's fan-out is bounded
        level.sort(key=lambda t: (leaf_subject[t.id], t.start_seq or 0))
        level = [theme_over(level[j : j + THEME_FANOUT]) for j in range(0, len(level), THEME_FANOUT)]
        themes.extend(level)
    root = TopicRecord(
        id=new_id("r"), user_id=user_id, kind="root", parent_id=None, start_seq=1, end_seq=n, size=n,
        first_at=h.times[0], last_at=h.times[-1], vec_sum=sums.sum(axis=0).astype(np.float32),
        meta=TopicMeta(current=last.id),
    )
    for t in level:
        t.parent_id = root.id
    return [root, *themes, *leaves], leaf_of


# -- loading ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class LoadStats(Serializable):
    exchanges: int
    topics: int
    subjects: int
    prepare_s: float     # synthesising texts, vectors, term statistics and the tree
    write_s: float       # writing rows and indexes (on PostgreSQL: COPY + topics)
    index_s: float       # Store.finish_load: PostgreSQL builds the HNSW index and ANALYZEs; SQLite ~0
    seconds: float


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def bulk_load(store: Store, world: World, size: int, *, user_id: str = "scale", chunk: int = 20_000,
              n_queries: int = 2000, seed: int = 7, progress: bool = False) -> tuple[LoadStats, History]:
    """Write a synthetic history of ``size`` exchanges into an empty partition (see the module
    docstring); returns the timings and the history (with its queries)."""
    from ..text import term_counts

    t0 = time.perf_counter()
    h = synthesise(world, size, n_queries, seed)
    vecs = np.concatenate([world.vectors(h.subjects[i : i + 50_000], np.random.default_rng(seed + 3 + i))
                           for i in range(0, size, 50_000)])
    counts = [term_counts(h.text(i)) for i in range(size)]
    df_counter: Counter[str] = Counter()
    for c in counts:
        df_counter.update(c.keys())
    df = dict(df_counter)
    nodes, leaf_of = build_tree(h, vecs, counts, df, user_id, seed=seed)
    del counts
    prepared = time.perf_counter()
    _log(progress, f"{size:,}: prepared {size:,} exchanges and {len(nodes) - 1:,} topics "
                   f"in {prepared - t0:.0f} s; writing")

    from ..organize.tree import topic_index_text

    # The store's own bulk path (Store.load_exchanges / load_topics / finish_load): through
    # the contract on SQLite, COPY on PostgreSQL.
    for lo in range(0, size, chunk):
        hi = min(size, lo + chunk)
        store.load_exchanges(user_id, [_exchange(h, i, user_id, leaf_of[i]) for i in range(lo, hi)],
                             vecs[lo:hi], [lexical_key(h, i) for i in range(lo, hi)])
        _log(progress and (hi // chunk) % 10 == 0, f"{size:,}: {hi:,} exchanges written")
    root, inner = nodes[:1], nodes[1:]
    for lo in range(0, len(inner), chunk):
        part = inner[lo : lo + chunk]
        store.load_topics(user_id, (root if lo == 0 else []) + part, {r.id: topic_index_text(r) for r in part})
    with store.transaction(user_id):
        store.add_term_counts(user_id, df)
    store.set_meta("embedder", SubjectEmbedder(world).spec)
    written = time.perf_counter()
    _log(progress, f"{size:,}: rows written in {written - prepared:.0f} s; finishing (indexes, statistics)")
    store.finish_load(user_id)
    index_s = time.perf_counter() - written
    stats = LoadStats(exchanges=size, topics=len(nodes) - 1, subjects=world.subjects,
                      prepare_s=prepared - t0, write_s=written - prepared, index_s=index_s,
                      seconds=time.perf_counter() - t0)
    _log(progress, f"{size:,}: loaded in {stats.seconds:.0f} s (prepare {stats.prepare_s:.0f}, "
                   f"write {stats.write_s:.0f}, index {stats.index_s:.0f})")
    return stats, h


def _exchange(h: History, i: int, user_id: str, topic_id: str) -> Exchange:
    user, assistant = h.user_texts[i], h.assistant_texts[i]
    return Exchange(
        id=h.ids[i], user_id=user_id, session_id=h.sessions[i], seq=i + 1, status="completed",
        messages=({"role": "user", "content": user}, {"role": "assistant", "content": assistant}),
        user_text=user, assistant_text=assistant, user_at=h.times[i], assistant_at=h.times[i],
        topic_id=topic_id,
    )


# -- measuring --------------------------------------------------------------------------------

@dataclass(frozen=True)
class ScaleConfig(Serializable):
    """One (store, size) run; picklable so it runs in a fresh process."""

    size: int
    store: str = "sqlite"
    database_url: str | None = None  # postgres: an empty database (the loader fills it)
    queries: int = 200
    clients: int = 0
    client_queries: int = 50
    budget: int = 1024
    dim: int = 384
    seed: int = 7
    db_dir: str | None = None
    progress: bool = True


@dataclass(frozen=True)
class ScaleResult(Serializable):
    """Figures of one (store, size). Times in ms unless named ``_s``."""

    store: str
    size: int
    embedder: str
    load: LoadStats
    load_per_s: float
    disk_bytes: int
    bytes_per_exchange: float
    first_recall_ms: float
    recall_ms: dict[str, float]
    stage_ms: dict[str, float]
    answer_rate: float
    recall_tokens_mean: float
    clients: int = 0
    concurrent_ms: dict[str, float] = field(default_factory=dict)
    concurrent_per_s: float = 0.0
    seconds: float = 0.0
    #: SQLite: seconds from the first recall until the background ANN graph was ready (recalls
    #: search exactly meanwhile; timings start after it); 0 when there was none.
    ann_ready_s: float = 0.0
    #: SQLite: a new process opening the memory again after the timed store was closed (which
    #: saved the ANN graphs and vector snapshots beside it): ms to construct ``Memory``, ms of
    #: its first recall, and seconds until its background graph load and check was done.
    reopen_open_ms: float = 0.0
    reopen_first_recall_ms: float = 0.0
    reopen_ann_ready_s: float = 0.0
    #: The same after the memory's files were evicted from the OS page cache (a cold disk,
    #: as after a reboot): the reopen above reads files the bench has just written, which
    #: are still in memory. 0 where the platform cannot evict them.
    cold_first_recall_ms: float = 0.0
    cold_ann_ready_s: float = 0.0
    #: MB/s of reading the largest of those files from the cold disk after that reopen: the
    #: cold first recall reads every vector once (the graph is trusted only after its check),
    #: so it moves with the disk as much as with the code; 0 where nothing was evicted.
    cold_read_mb_s: float = 0.0


@dataclass(frozen=True)
class ScaleReport(Serializable):
    results: tuple[ScaleResult, ...]
    machine: str
    date: str
    command: str = ""
    version: str = ""
    notes: tuple[str, ...] = ()


def _stages(traces: list[dict[str, float]]) -> dict[str, float]:
    keys = ("embed", "lexical", "indexes", "fuse", "expand", "pack", "render", "total")
    return {k: round(statistics.median(t.get(k, 0.0) for t in traces), 2) for k in keys}


def time_recalls(mem: Any, queries: Sequence[tuple[str, int]], ids: Sequence[str], user_id: str,
                 budget: int) -> tuple[list[float], list[dict[str, float]], float, float]:
    """Latencies (ms) of ``mem.recall`` per query, their stage timings, the share of recalls
    that packed the exchange each query was made from, and the mean tokens."""
    ms, traces, found, tokens = [], [], 0, 0
    for q, target in queries:
        t0 = time.perf_counter()
        r = mem.recall(q, user_id=user_id, max_tokens=budget)
        ms.append((time.perf_counter() - t0) * 1000)
        traces.append(dict(r.trace.timings_ms))
        found += any(e.id == ids[target] for e in r.exchanges)
        tokens += r.tokens
    n = max(1, len(queries))
    return ms, traces, found / n, tokens / n


def wait_for_background_graphs(store: Any, timeout: float = 3600.0) -> float:
    """Seconds until no ANN graph of the store is still being built in the background.

    SQLiteStore builds an HNSW graph over a big partition in a thread on first search and
    searches exactly meanwhile (store/sqlite.py); steady-state latency is measured after it.
    Reads a private attribute on purpose: a benchmark probe, not an API (other stores have none).
    """
    t0 = time.perf_counter()
    while any(getattr(slot, "building", False) for slot in list(getattr(store, "_ann", {}).values())):
        if time.perf_counter() - t0 > timeout:
            raise ConfigError(f"the ANN graph was not ready after {timeout:.0f} s")
        time.sleep(0.2)
    return time.perf_counter() - t0


def _open(cfg: ScaleConfig, path: Path | None, embedder: Embedder) -> Any:
    from ..memory import Memory

    if cfg.store == "postgres":
        return Memory(database_url=cfg.database_url, embedder=embedder)
    return Memory(str(path), embedder=embedder)


def _client(cfg: ScaleConfig, path: str | None, queries: list[str], barrier: Any, out: Any) -> None:
    """One concurrent client process: open its own Memory, warm up, wait for the others, recall."""
    world = World(cfg.size, cfg.dim, cfg.seed)
    mem = _open(cfg, Path(path) if path else None, SubjectEmbedder(world))
    try:
        for q in queries[:2]:
            mem.recall(q, user_id="scale", max_tokens=cfg.budget)
        barrier.wait()
        start = time.time()
        ms = []
        for q in queries:
            t0 = time.perf_counter()
            mem.recall(q, user_id="scale", max_tokens=cfg.budget)
            ms.append((time.perf_counter() - t0) * 1000)
        out.put((start, time.time(), ms))
    finally:
        mem.close()


def _reopen(cfg: ScaleConfig, path: str, query: str, out: Any) -> None:
    """A cold process: open the saved memory, time its first recall, wait for its graphs."""
    world = World(cfg.size, cfg.dim, cfg.seed)
    emb = SubjectEmbedder(world)
    t0 = time.perf_counter()
    mem = _open(cfg, Path(path), emb)
    opened = (time.perf_counter() - t0) * 1000
    try:
        t0 = time.perf_counter()
        mem.recall(query, user_id="scale", max_tokens=cfg.budget)
        first = (time.perf_counter() - t0) * 1000
        ready = wait_for_background_graphs(mem.store)
        out.put((opened, first, ready))
    finally:
        mem.close()


def evict_from_page_cache(paths: list[Path]) -> bool:
    """Drop the files' pages from the OS page cache (written back first, then
    ``POSIX_FADV_DONTNEED``), so the next open reads them from disk, as after a reboot; no
    root needed, unlike ``/proc/sys/vm/drop_caches``. False where the platform has no
    ``posix_fadvise``."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def cold_read_rate(path: Path, chunk: int = 8 << 20) -> float:
    """MB/s of reading ``path`` whole after evicting it from the page cache (0.0 where the
    platform cannot evict): what a cold disk gives this machine today."""
    if not evict_from_page_cache([path]):
        return 0.0
    t0 = time.perf_counter()
    n = 0
    with open(path, "rb", buffering=0) as f:
        while block := f.read(chunk):
            n += len(block)
    seconds = time.perf_counter() - t0
    evict_from_page_cache([path])  # leave it as cold as it was found
    return n / 1e6 / seconds if seconds > 0 else 0.0


def reopen_recall(cfg: ScaleConfig, path: str, query: str) -> tuple[float, float, float]:
    """(open ms, first recall ms, graph ready s) of a fresh process reopening ``path``."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_reopen, args=(cfg, path, query, out))
    p.start()
    try:
        return out.get(timeout=3600)
    finally:
        p.join(timeout=600)
        if p.is_alive():
            p.terminate()


def concurrent_recall(cfg: ScaleConfig, path: str | None, queries: list[str]) -> tuple[list[float], float]:
    """``cfg.clients`` processes recalling at once, ``cfg.client_queries`` each: every call's
    latency, and the throughput (recalls per second of wall time, all clients together)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(cfg.clients)
    out = ctx.Queue()
    per = cfg.client_queries
    procs = [ctx.Process(target=_client, args=(cfg, path, [queries[(c * per + j) % len(queries)] for j in range(per)],
                                               barrier, out))
             for c in range(cfg.clients)]
    for p in procs:
        p.start()
    try:
        got = [out.get(timeout=3600) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.terminate()
    ms = [x for _, _, m in got for x in m]
    wall = max(e for _, e, _ in got) - min(s for s, _, _ in got)
    return ms, len(ms) / wall if wall > 0 else 0.0


def run_size(cfg: ScaleConfig) -> ScaleResult:
    """Load one partition, reopen it, time recall (and concurrent recall), return the figures."""
    if cfg.store not in STORES:
        raise ConfigError(f"unknown store {cfg.store!r}; choose from {', '.join(STORES)}")
    if cfg.store == "postgres" and not cfg.database_url:
        raise ConfigError("the postgres scale run needs a database URL")
    t_start = time.perf_counter()
    world = World(cfg.size, cfg.dim, cfg.seed)
    emb = SubjectEmbedder(world)
    with tempfile.TemporaryDirectory(prefix="arbormem-scale-", dir=cfg.db_dir) as tmp:
        path = Path(tmp) / "scale.db"
        store: Store
        if cfg.store == "postgres":
            from ..store.postgres import PostgresStore

            store = PostgresStore(cfg.database_url or "", max_size=2)
        else:
            from ..store.sqlite import SQLiteStore

            store = SQLiteStore(path)
        try:
            load, h = bulk_load(store, world, cfg.size, n_queries=max(cfg.queries, 2000), seed=cfg.seed,
                                progress=cfg.progress)
        finally:
            store.close()
        queries = h.queries
        ids, n_exchanges = h.ids, len(h)
        del h
        mem = _open(cfg, path, emb)  # a fresh store: caches start cold, as after a restart
        try:
            t0 = time.perf_counter()
            mem.recall(queries[0][0], user_id="scale", max_tokens=cfg.budget)
            first = (time.perf_counter() - t0) * 1000
            ann_ready = wait_for_background_graphs(mem.store)
            if ann_ready > 0.5:
                _log(cfg.progress, f"{cfg.size:,}: ANN graphs ready {ann_ready:.0f} s after the first recall")
            for q, _ in queries[1:3]:
                mem.recall(q, user_id="scale", max_tokens=cfg.budget)
            ann_ready += wait_for_background_graphs(mem.store)  # a graph started by those recalls
            _log(cfg.progress, f"{cfg.size:,}: first recall {first:.0f} ms; timing {cfg.queries} recalls")
            timed = queries[3 : 3 + cfg.queries]
            ms, traces, answer_rate, tokens = time_recalls(mem, timed, ids, "scale", cfg.budget)
            if cfg.store == "postgres":
                disk = mem.store.database_bytes()
            else:
                mem.close()  # saves the ANN graphs beside the database: count them too
                graphs = path.with_name(path.name + ".ann")
                disk = _db_bytes(path) + sum(f.stat().st_size for f in graphs.rglob("*") if f.is_file())
        finally:
            mem.close()
        rc = _pcts(ms)
        _log(cfg.progress, f"{cfg.size:,}: recall p50 {rc['p50']:.1f} ms, p95 {rc['p95']:.1f} ms, "
                           f"answer found in {answer_rate:.0%}")
        reopen = cold = (0.0, 0.0, 0.0)
        cold_mb_s = 0.0
        if cfg.store == "sqlite":
            reopen = reopen_recall(cfg, str(path), queries[-1][0])
            _log(cfg.progress, f"{cfg.size:,}: reopened in a new process: open {reopen[0]:.0f} ms, first recall "
                               f"{reopen[1]:.0f} ms, ANN graphs loaded and checked {reopen[2]:.1f} s after it")
            graphs = path.with_name(path.name + ".ann")
            files = [f for f in [path, *path.parent.glob(path.name + "-*"), *graphs.rglob("*")] if f.is_file()]
            if evict_from_page_cache(files):
                cold = reopen_recall(cfg, str(path), queries[-2][0])
                cold_mb_s = cold_read_rate(max(files, key=lambda f: f.stat().st_size))
                _log(cfg.progress, f"{cfg.size:,}: reopened from a cold disk (files evicted from the page cache): "
                                   f"first recall {cold[1]:.0f} ms, ANN graphs checked {cold[2]:.1f} s after it; "
                                   f"the disk reads {cold_mb_s:,.0f} MB/s cold")
        conc: dict[str, float] = {}
        conc_rate = 0.0
        if cfg.clients > 0:
            _log(cfg.progress, f"{cfg.size:,}: {cfg.clients} concurrent clients x {cfg.client_queries} recalls")
            cms, conc_rate = concurrent_recall(cfg, str(path), [q for q, _ in queries[3 + cfg.queries :] or queries])
            conc = _pcts(cms)
            _log(cfg.progress, f"{cfg.size:,}: concurrent p50 {conc['p50']:.1f} ms, p95 {conc['p95']:.1f} ms, "
                               f"{conc_rate:.1f} recalls/s")
    return ScaleResult(
        store=cfg.store, size=cfg.size, embedder=emb.name, load=load,
        load_per_s=n_exchanges / load.seconds if load.seconds > 0 else 0.0,
        disk_bytes=disk, bytes_per_exchange=disk / n_exchanges, first_recall_ms=first,
        recall_ms=rc, stage_ms=_stages(traces), answer_rate=answer_rate, recall_tokens_mean=tokens,
        clients=cfg.clients, concurrent_ms=conc, concurrent_per_s=conc_rate,
        seconds=time.perf_counter() - t_start, ann_ready_s=round(ann_ready, 1),
        reopen_open_ms=round(reopen[0], 1), reopen_first_recall_ms=round(reopen[1], 1),
        reopen_ann_ready_s=round(reopen[2], 1),
        cold_first_recall_ms=round(cold[1], 1), cold_ann_ready_s=round(cold[2], 1),
        cold_read_mb_s=round(cold_mb_s),
    )


def _child(cfg: ScaleConfig) -> ScaleResult:
    import signal

    # SIGTERM unwinds normally, so the temporary database is removed, not left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return run_size(cfg)


def run_scale(configs: Sequence[ScaleConfig], *, isolate: bool = True,
              prepare: Callable[[ScaleConfig], Iterator[ScaleConfig]] | None = None,
              on_result: Callable[[ScaleResult], None] | None = None) -> ScaleReport:
    """Run every config (each in a fresh process with ``isolate``). ``prepare`` may wrap each
    run, e.g. to create an empty PostgreSQL database before it and drop it after: it yields
    the config to run."""
    from contextlib import contextmanager

    from .runner import code_version, machine_description

    @contextmanager
    def nothing(c: ScaleConfig) -> Iterator[ScaleConfig]:
        yield c

    wrap = contextmanager(prepare) if prepare is not None else nothing
    results = []
    for cfg in configs:
        with wrap(cfg) as ready:
            if isolate:
                import multiprocessing as mp
                from concurrent.futures import ProcessPoolExecutor

                with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
                    res = pool.submit(_child, ready).result()
            else:
                res = run_size(ready)
        results.append(res)
        if on_result is not None:
            on_result(res)
    return ScaleReport(results=tuple(results), machine=machine_description(),
                       date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), version=code_version())


def load_scale_report(path: str | Path) -> ScaleReport:
    import json

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        results = tuple(ScaleResult(**{**r, "load": LoadStats(**r["load"])}) for r in data["results"])
        return ScaleReport(results, data["machine"], data["date"], data.get("command", ""),
                           data.get("version", ""), tuple(data.get("notes", ())))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a scale report: {exc}") from exc


def merge_scale(new: ScaleReport, older: Sequence[ScaleReport]) -> ScaleReport:
    """``new`` plus the (store, size) rows of ``older`` reports it does not repeat, noted."""
    from dataclasses import replace

    have = {(r.store, r.size) for r in new.results}
    results, notes = list(new.results), list(new.notes)
    for rep in older:
        extra = [r for r in rep.results if (r.store, r.size) not in have]
        if extra:
            have.update((r.store, r.size) for r in extra)
            results.extend(extra)
            notes.append(f"Rows {', '.join(f'{r.store} {r.size:,}' for r in extra)}: run of {rep.date}, "
                         f"arbormem {rep.version or '?'}" + (f" (`{rep.command}`)." if rep.command else "."))
    results.sort(key=lambda r: (STORES.index(r.store) if r.store in STORES else 9, r.size))
    return replace(new, results=tuple(results), notes=tuple(notes))


def _stage(stages: Mapping[str, float], key: str) -> str:
    """A stage's p50 for the table ("-": a report from before the stage was timed)."""
    return f"{stages[key]:.1f}" if key in stages else "-"


def scale_markdown(rep: ScaleReport) -> str:
    """The scale table, with each size's p95 as a multiple of the smallest size's (per store)."""
    lines = [
        f"arbormem {rep.version}; embedder `{rep.results[0].embedder if rep.results else '?'}` "
        f"(synthetic vectors, bulk loader); {rep.machine}; {rep.date}."
        + (f" Command: `{rep.command}`." if rep.command else ""),
        "",
        "| store | exchanges | topics | bulk load s (exchanges/s) | disk bytes / exchange | first recall ms "
        "| recall p50 / p95 / p99 ms | p95 vs smallest | stages p50 ms: lexical / indexes / fuse / expand / pack / render | answer found "
        "| concurrent clients: p50 / p95 ms, recalls/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base: dict[str, float] = {}
    for r in sorted(rep.results, key=lambda r: (r.store, r.size)):
        base.setdefault(r.store, r.recall_ms["p95"])
    for r in rep.results:
        s = r.stage_ms
        conc = (f"{r.clients}: {r.concurrent_ms['p50']:.1f} / {r.concurrent_ms['p95']:.1f}, "
                f"{r.concurrent_per_s:.1f}/s" if r.clients and r.concurrent_ms else "-")
        disk = f"; disk {r.cold_read_mb_s:,.0f} MB/s" if r.cold_read_mb_s else ""
        lines.append(
            f"| {r.store} | {r.size:,} | {r.load.topics:,} | {r.load.seconds:,.0f} ({r.load_per_s:,.0f}) "
            f"| {r.bytes_per_exchange:,.0f} | {r.first_recall_ms:,.0f}"
            + (f" (ANN graph ready after {r.ann_ready_s:,.0f} s)" if r.ann_ready_s >= 1 else "")
            + (f"; reopened: {r.reopen_first_recall_ms:,.0f} (open {r.reopen_open_ms:,.0f}, graph checked "
               f"after {r.reopen_ann_ready_s:,.1f} s)" if r.reopen_first_recall_ms else "")
            + (f"; from a cold disk: {r.cold_first_recall_ms:,.0f} (graph checked after "
               f"{r.cold_ann_ready_s:,.1f} s{disk})" if r.cold_first_recall_ms else "") + " "
            f"| {r.recall_ms['p50']:.1f} / {r.recall_ms['p95']:.1f} / {r.recall_ms['p99']:.1f} "
            f"| {r.recall_ms['p95'] / base[r.store]:.2f}x | {_stage(s, 'lexical')} / {_stage(s, 'indexes')} / {_stage(s, 'fuse')} / {_stage(s, 'expand')} / {_stage(s, 'pack')} / {_stage(s, 'render')} "
            f"| {r.answer_rate:.0%} | {conc} |")
    lines += [""] + [f"- {n}" for n in rep.notes]
    return "\n".join(lines).rstrip() + "\n"


__all__ = [
    "STORES", "History", "LoadStats", "ScaleConfig", "ScaleReport", "ScaleResult", "SubjectEmbedder", "World",
    "build_tree", "bulk_load", "cold_read_rate", "concurrent_recall", "lexical_key", "load_scale_report", "merge_scale",
    "reopen_recall", "run_scale", "run_size", "scale_markdown", "subjects_for", "synthesise", "time_recalls",
]
