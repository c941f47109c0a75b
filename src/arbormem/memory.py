"""The ``Memory`` facade: the public API over store, embedder, tree and retriever.

Write path (``begin``/``complete``/``add``/``add_many``): validate everything first, embed
outside the lock, then in one store transaction allocate the sequence number, place the
exchange in the tree, write its row and index entries (``ingest.py``, the one write path every
writer uses). No LLM is ever called here. With ``Settings.placement = "background"``,
``complete`` only stores the reply and a worker embeds and places in batches
(``backlog.py``); every read of the tree or indexes first waits for the user's queue.

Read path (``recall``/``search``): see ``retrieve/engine.py``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from . import validate as v
from .backlog import Backlog, PlacementFailure
from .config import Settings
from .embed import Embedder, make_embedder
from .errors import (
    ArbormemError,
    ConfigError,
    ConfirmationRequired,
    NotFoundError,
    StateError,
    ValidationError,
)
from .ingest import Writer
from .llm import LLM, LLMCall, LLMRunner, make_runner
from .models import (
    Exchange,
    ForgetReport,
    Hit,
    ImportReport,
    Recall,
    ReembedProgress,
    ReembedReport,
    SkippedItem,
    Stats,
    Topic,
)
from .organize.consolidate import ConsolidationOptions, consolidate
from .organize.enrich import EnrichReport, organize_labels, topic_detail
from .organize.models import Change, ConsolidationReport, RecallMode, TopicReading
from .organize.reading import change_history, read_topic, set_recall_mode, undo
from .organize.tree import TreeSession, new_id
from .reembed import reembed
from .retrieve.engine import Retriever
from .retrieve.llm_plan import RecallPlanner
from .retrieve.topics import TopicPaths
from .store.base import Store, TopicRecord
from .text import term_counts
from .tokens import TokenCounter

if TYPE_CHECKING:
    from .documents import DocumentReport

ProgressFn = Callable[[int, int], None]
#: Change-log target of an import's idempotency key (``add_many(request_id=...)``).
_IMPORT_PREFIX = "import:"
#: Change-log target of an imported exchange's content hash (``import_exchanges``).
_HASH_PREFIX = "xhash:"

class Memory:
    """Long-term memory of conversations, organised as a tree of topics.

    ``Memory("memory.db")`` opens (or creates) an embedded SQLite memory; ``Memory(":memory:")``
    keeps it in RAM. Pass ``store=`` for any other ``Store``, or ``database_url=`` for
    PostgreSQL. ``embedder`` is an ``Embedder``, ``"local"`` (the bundled MiniLM, default),
    ``"hash"`` (deterministic, for tests) or a sentence-transformers model folder.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        store: Store | None = None,
        database_url: str | None = None,
        embedder: Embedder | str | None = None,
        llm: LLM | LLMRunner | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.settings = settings or Settings()
        given = [x is not None for x in (path, store, database_url)]
        if sum(given) > 1:
            raise ConfigError("pass at most one of path, store= and database_url=")
        if store is None:
            url = database_url or (None if path is not None else self.settings.database_url)
            if url:
                from .store.postgres import PostgresStore

                store = PostgresStore(url)
            else:
                from .store.sqlite import SQLiteStore

                store = SQLiteStore(path if path is not None else self.settings.db)
        self.store: Store = store
        self.embedder: Embedder = make_embedder(
            embedder if embedder is not None else self.settings.embedder,
            threads=self.settings.torch_threads, batch_size=self.settings.embed_batch_size,
        )
        # Optional: an LLM argument, else ARBORMEM_LLM__BASE_URL + __MODEL, else offline.
        self.llm: LLMRunner | None = make_runner(llm, self.settings.llm)
        self._owns_llm = llm is None and self.llm is not None
        self.tokens = TokenCounter()
        self.retriever = Retriever(self.store, self.embedder, self.tokens, self.settings.recall)
        #: The one write path (``ingest.py``): validation, embedding, units of work, deletion.
        self.writer = Writer(self.store, self.embedder, self.settings)
        #: Completed exchanges waiting for embedding and placement (``backlog.py``): fed by
        #: ``complete`` in background mode; its worker thread starts with the first one.
        self._backlog = Backlog(self.writer, batch=self.settings.placement_batch,
                                close_timeout=self.settings.placement_close_timeout)
        self._closed = False

    # -- lifecycle ------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the store. The Memory cannot be used afterwards. In background placement
        the worker first places what is queued, for at most
        ``settings.placement_close_timeout`` seconds; what is left stays queued in the store
        and is placed on the next use of the memory."""
        if not self._closed:
            self._closed = True
            self._backlog.close()
            self.store.close()
            if self._owns_llm and self.llm is not None:
                self.llm.close()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def warm_up(self) -> float:
        """Load the embedding model (and the token counter) now instead of on first use;
        returns the seconds it took. Servers call it at start, in the background, so the
        first write does not stall for the model load."""
        t0 = time.perf_counter()
        self.embedder.embed(["warm up"])
        self.tokens.count("warm up")
        return time.perf_counter() - t0

    # -- write path -----------------------------------------------------------------------------
    def begin(
        self, user_text: str, *, user_id: str, session_id: str | None = None,
        at: datetime | str | None = None, metadata: Mapping[str, Any] | None = None,
    ) -> Exchange:
        """Record a user message as a pending exchange (before the assistant replies)."""
        uid = v.user_id(user_id)
        body = v.text(user_text, "user_text", self.settings.max_message_chars)
        ex_at, sid = v.when(at), v.session_id(session_id)
        meta = v.metadata(metadata, self.settings.limits)
        with self.store.transaction(uid):
            ex = Exchange(
                id=new_id("x"), user_id=uid, session_id=sid, seq=self.store.next_seq(uid),
                status="pending", messages=({"role": "user", "content": body},), user_text=body,
                assistant_text="", user_at=ex_at, assistant_at=None, metadata=meta,
            )
            self.store.insert_exchange(ex)
        return ex

    def complete(self, exchange_id: str, assistant_text: str, *, at: datetime | str | None = None,
                 user_id: str | None = None) -> Exchange:
        """Attach the assistant's reply, place the exchange in the tree and index it.
        With ``user_id`` an exchange of another user is not found (every door passes it).

        With ``settings.placement = "background"`` the reply is stored (durably, in one
        transaction) and the exchange returned at once, with no topic yet: a worker thread
        embeds and places it, and every read of the tree or indexes waits for that."""
        ex = self._pending(exchange_id, user_id)
        reply = v.text(assistant_text, "assistant_text", self.settings.max_message_chars)
        if len(ex.user_text) + len(reply) > self.settings.limits.max_exchange_chars:
            raise ValidationError(f"the exchange would hold more than {self.settings.limits.max_exchange_chars} "
                                  "characters of text; that is the limit for one exchange")
        done_at = v.when(at)
        done = dataclasses.replace(
            ex, status="completed", assistant_text=reply, assistant_at=done_at,
            messages=(*ex.messages, {"role": "assistant", "content": reply}),
        )
        if self.settings.placement == "background":
            # Refuse a memory bound to another embedder now, not in the worker; a fresh
            # memory is bound by the placement that embeds.
            self.writer.check_embedder(bind=False)
            with self.store.transaction(ex.user_id):
                current = self.store.get_exchange(exchange_id)
                if current is None or current.status != "pending":
                    raise StateError(f"exchange {exchange_id} is no longer pending")
                # Completed with no topic: queued for placement (backlog.py).
                self.store.update_exchange(done)
            self._backlog.queued(ex.user_id)
            return done
        # Placed in completion order, after anything still queued for the user.
        self._await(ex.user_id)
        vec = self.writer.embed([done.text])[0]  # ingest.py: embed, then bind the embedder
        with self.store.transaction(ex.user_id):
            current = self.store.get_exchange(exchange_id)
            if current is None or current.status != "pending":
                raise StateError(f"exchange {exchange_id} is no longer pending")
            unit = self.writer.unit(ex.user_id)
            done = unit.add(done, vec, update=True)
            unit.finish()
        return done

    def fail(self, exchange_id: str, reason: str, *, user_id: str | None = None) -> Exchange:
        """Mark a pending exchange failed (the reply never came). It is never recalled.
        With ``user_id`` an exchange of another user is not found."""
        ex = self._pending(exchange_id, user_id)
        why = v.text(reason, "reason", 10_000)
        with self.store.transaction(ex.user_id):
            current = self.store.get_exchange(exchange_id)
            if current is None or current.status != "pending":
                raise StateError(f"exchange {exchange_id} is no longer pending")
            failed = dataclasses.replace(current, status="failed", failure=why)
            self.store.update_exchange(failed)
        return failed

    def _pending(self, exchange_id: str, user_id: str | None) -> Exchange:
        ex = self.get(exchange_id, user_id=user_id)
        if ex.status != "pending":
            raise StateError(f"exchange {exchange_id} is {ex.status}, not pending")
        return ex

    # -- background placement (backlog.py) -----------------------------------------------------
    def flush(self, user_id: str | None = None, *, timeout: float | None = None) -> None:
        """Place every queued exchange of the user (``None``: of every user in the store)
        before returning: waits for the worker's batch in progress (``timeout`` seconds at
        most for each user, else ``StateError``), then places the rest in this thread. Raises
        what a failing placement raised (an ``EmbeddingError``, a ``StoreError``...); the
        exchanges then stay queued and are retried by the next flush or completion. Reads
        flush their user themselves; this is for callers that want the work done now (before
        a benchmark's clock stops, before a backup). Always consults the store, so exchanges
        another process left queued (a crash) are placed too."""
        timeout = _non_negative(timeout, "timeout must be a finite number of seconds >= 0, or None")
        if self._closed:
            raise StateError("this Memory is closed")
        users = [v.user_id(user_id)] if user_id is not None else list(
            dict.fromkeys([*self._backlog.pending_users(), *self.store.list_users()]))
        for uid in users:
            self._backlog.wait(uid, timeout=timeout, force=True)

    @property
    def placement_errors(self) -> tuple[PlacementFailure, ...]:
        """Recent failures to place queued exchanges (newest last; at most 50): each names
        the user, the exchanges (still queued) and the error. Also logged."""
        return tuple(self._backlog.failures)

    def _await(self, user_id: str, *, strict: bool = True) -> None:
        """Before a read or write of the user's tree or indexes: place what is queued
        (``backlog.py``). Cheap when nothing is. ``strict=False`` (deletions) goes on
        without the placement if it fails: an exchange must stay deletable while the
        embedder is down, and a queued one has nothing but its row to delete."""
        try:
            self._backlog.wait(user_id)
        except ArbormemError:
            if strict:
                raise

    def add(
        self, messages: Sequence[Mapping[str, Any]], *, user_id: str, session_id: str | None = None,
        at: datetime | str | None = None, metadata: Mapping[str, Any] | None = None,
    ) -> Exchange:
        """Store one whole exchange (OpenAI-format messages) in one call and transaction."""
        return self.add_many(
            [{"messages": messages, "session_id": session_id, "at": at, "metadata": metadata}],
            user_id=user_id,
        )[0]

    def add_many(
        self, items: Iterable[Mapping[str, Any]], *, user_id: str, batch_size: int = 256,
        progress: ProgressFn | None = None, request_id: str | None = None,
    ) -> list[Exchange]:
        """Bulk import, all or nothing. Items: dicts with ``messages`` and optional
        ``session_id``, ``at`` (user time), ``assistant_at``, ``metadata``.

        Every item is validated first, then embedded in batches of ``batch_size`` (no lock held;
        ``progress(done, total)`` after each), then all are stored in one store transaction.
        A bad item, an embedder failure in any batch or a store failure stores nothing, so the
        same call can simply be retried. ``request_id`` (a client's idempotency key) covers the
        case where the caller cannot know whether a call went through (a lost reply): a call
        with a key the user's memory already stored returns the exchanges stored then (those
        not deleted since) and stores nothing. The key is kept in the change log.
        Every item is stored, even one repeating a stored exchange: ``import_exchanges`` skips
        those (re-importing a file)."""
        return list(self._add_many(items, user_id, batch_size, progress, request_id, dedupe=False).added)

    def import_exchanges(
        self, items: Iterable[Mapping[str, Any]], *, user_id: str, batch_size: int = 256,
        progress: ProgressFn | None = None, request_id: str | None = None,
    ) -> ImportReport:
        """``add_many`` that is idempotent by content: an item repeating an exchange an
        earlier import stored (same messages, session and given times; metadata aside) is
        skipped, and the ``ImportReport`` says which (item index, stored exchange id).
        Importing the same file twice stores it once. Repeats inside one call are kept
        (a conversation may hold the same "thanks" twice), and count against as many stored
        copies on the next import. What ``arbormem import`` and ``POST .../exchanges/import`` use."""
        return self._add_many(items, user_id, batch_size, progress, request_id, dedupe=True)

    def _add_many(
        self, items: Iterable[Mapping[str, Any]], user_id: str, batch_size: int,
        progress: ProgressFn | None, request_id: str | None, *, dedupe: bool,
    ) -> ImportReport:
        """The one bulk write path (``add_many``, ``import_exchanges``, ``add``)."""
        uid = v.user_id(user_id)
        v.integer(batch_size, "batch_size", 1)
        key = None if request_id is None else _IMPORT_PREFIX + v.item_id(request_id, "request_id")
        if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
            raise ValidationError("items must be an iterable of dicts with 'messages'")
        raw = list(items)
        prepared = [self.writer.prepare(uid, item, i) for i, item in enumerate(raw)]
        self._await(uid)  # queued exchanges come first, as they would have inline
        hashes = [_content_hash(ex, item) for ex, item in zip(prepared, raw, strict=True)] if dedupe else []
        if key is not None and (done := self._imported(uid, key)) is not None:
            return ImportReport(added=tuple(done))
        # Skipped before embedding (re-importing a file embeds nothing); checked again under
        # the write lock, which is what makes it safe against a concurrent import.
        skipped = self._repeats(uid, hashes) if dedupe else {}
        todo = [i for i in range(len(prepared)) if i not in skipped]
        if not todo:
            return ImportReport(skipped=_skipped(skipped))
        total = len(todo)
        vecs: dict[int, np.ndarray] = {}
        # Embedded shortest first across the whole call: an embedder pads each of its batches to
        # the longest text in it, and sorting only within each ``batch_size`` slice left
        # add_many's embedding 12% slower than one call over the same LoCoMo texts.
        by_length = sorted(todo, key=lambda i: len(prepared[i].text))
        for start in range(0, total, batch_size):
            part = by_length[start : start + batch_size]
            vecs.update(zip(part, self.writer.embed([prepared[i].text for i in part]), strict=True))
            if progress is not None:
                progress(min(start + batch_size, total), total)
        out: list[Exchange] = []
        with self.store.transaction(uid):
            if key is not None and (done := self._imported(uid, key)) is not None:
                return ImportReport(added=tuple(done))  # a concurrent call with the same key got there first
            if dedupe:
                skipped = self._repeats(uid, hashes)
                todo = [i for i in range(len(prepared)) if i not in skipped]
                late = [i for i in todo if i not in vecs]  # its stored copy was deleted meanwhile
                if late:
                    vecs.update(zip(late, self.writer.embed([prepared[i].text for i in late]), strict=True))
            # One sequence number is allocated and the rest follow it: the transaction holds
            # the user's write lock, and storing an exchange raises the user's counter past
            # its seq (store contract), so the counter ends where a next_seq per exchange
            # left it, at two statements less per exchange.
            seq = self.store.next_seq(uid) if todo else 0
            # Placed and indexed batch by batch (each lexical key written once per batch, the
            # tree's changed nodes flushed once per batch), all inside the one transaction.
            for start in range(0, len(todo), batch_size):
                part = todo[start : start + batch_size]
                unit = self.writer.unit(uid)
                for i in part:
                    ex = unit.add(dataclasses.replace(prepared[i], seq=seq), vecs[i])
                    seq += 1
                    if dedupe:
                        self.store.log_change(uid, "import_item", _HASH_PREFIX + hashes[i], {"exchange_id": ex.id})
                unit.finish()
                out.extend(unit.added)
                if unit.moved:  # segmentation moved earlier exchanges to a new topic
                    out = [dataclasses.replace(e, topic_id=unit.moved[e.id]) if e.id in unit.moved else e
                           for e in out]
            if key is not None:
                self.store.log_change(uid, "import", key, {"ids": [e.id for e in out]})
        return ImportReport(added=tuple(out), skipped=_skipped(skipped))

    def _repeats(self, uid: str, hashes: Sequence[str]) -> dict[int, str]:
        """Item index -> id of the stored exchange it repeats. Each stored copy answers one
        item: two identical items against one stored copy skip the first, store the second."""
        live: dict[str, list[str]] = {}
        out: dict[int, str] = {}
        for i, h in enumerate(hashes):
            if h not in live:
                ids = [str(c.detail.get("exchange_id", "")) for c in
                       self.store.list_changes(uid, target_id=_HASH_PREFIX + h, limit=10_000)]
                live[h] = [e.id for e in self.store.get_exchanges(uid, [x for x in ids if x])]
            if live[h]:
                out[i] = live[h].pop(0)
        return out

    def _imported(self, user_id: str, key: str) -> list[Exchange] | None:
        """The exchanges an earlier import with this key stored (None: no such import)."""
        for change in self.store.list_changes(user_id, target_id=key, limit=1):
            ids = change.detail.get("ids")
            return self.store.get_exchanges(user_id, [str(i) for i in ids]) if isinstance(ids, list) else []
        return None

    def add_document(
        self, text: str, *, source: str, user_id: str, at: datetime | str | None = None,
        metadata: Mapping[str, Any] | None = None, max_chars: int = 1200, overlap_chars: int = 200,
    ) -> DocumentReport:
        """Chunk a document at paragraph/sentence boundaries (with overlap) and file the chunks
        into the tree like exchanges, recallable with their source.

        ``source`` names the document: adding under a source already held replaces that
        source's previous version in one transaction (unchanged chunks are kept as they are,
        the others go through the deletion path; ``DocumentReport.removed``). Re-adding the
        same text stores nothing, across processes (``documents.py``)."""
        from .documents import add_document

        self._await(v.user_id(user_id))
        return add_document(self.writer, text, source=source, user_id=user_id, at=at, metadata=metadata,
                            max_chars=max_chars, overlap_chars=overlap_chars)

    def delete_document(self, source: str, *, user_id: str) -> tuple[str, ...]:
        """Delete the document stored under ``source``: every chunk, from the transcript, the
        tree and every index, in one transaction. Returns the deleted exchange ids;
        ``NotFoundError`` if the user holds no document under that source."""
        from .documents import delete_document

        self._await(v.user_id(user_id), strict=False)
        return delete_document(self.writer, source, user_id=user_id)

    # -- read path ------------------------------------------------------------------------------
    def recall(
        self, query: str, *, user_id: str, max_tokens: int | None = None, recent: int | None = None,
        use_llm: bool = True, session_id: str | None = None, since: datetime | str | None = None,
        until: datetime | str | None = None, metadata: Mapping[str, Any] | None = None,
        min_relevance: float | None = None,
    ) -> Recall:
        """The memory context to inject for a new user message, within ``max_tokens``.

        Only exchanges relevant to the query are packed: when none reaches the relevance floor
        (``min_relevance``, default ``settings.recall.min_relevance``; 0 fills the budget as
        far as the ranking goes) the context holds the recent window only and
        ``trace.stopped`` says so. ``session_id``, ``since`` / ``until`` (``since <= time <
        until``) and ``metadata`` (key equality) restrict every exchange it may return,
        the recent window included.
        With an LLM configured (and ``use_llm``), one LLM call plans the recall; if it fails,
        the offline ranking is used and ``trace.notes`` says so."""
        uid = v.user_id(user_id)
        body = v.text(query, "query", self.settings.max_message_chars)
        budget = v.integer(self.settings.recall.max_tokens if max_tokens is None else max_tokens, "max_tokens")
        n_recent = v.integer(self.settings.recall.recent if recent is None else recent, "recent")
        where = v.exchange_filter(session_id, since, until, metadata)
        floor = _relevance(min_relevance)
        self._await(uid)
        self.writer.check_embedder()
        planner = (RecallPlanner(self.llm, deadline=self.settings.llm.recall_deadline)
                   if self.llm is not None and use_llm else None)
        return self.retriever.recall(uid, body, budget, n_recent,
                                     lambda rec, path: _topic(rec, len(path), path, ()), planner,
                                     where=where, min_relevance=floor)

    # -- organiser ------------------------------------------------------------------------------
    def organize(self, user_id: str, *, limit: int = 50, segment: bool = False,
                 budget: float | None = None) -> EnrichReport:
        """Label and summarise up to ``limit`` frozen topics through the LLM (none offline).

        With ``segment=True`` the LLM first re-segments the recent open tail (Topic Memory's
        topic worker, incremental and bounded: ``organize/segment.py``).
        ``budget`` (seconds, default ``settings.llm.organize_budget``) bounds the run's LLM
        calls in all; what is left over waits for the next run.
        Runs outside the write path: the LLM is called with no lock held, and a topic's labels
        change only when the model's answer passed validation (see ``organize/enrich.py``)."""
        uid = v.user_id(user_id)
        v.integer(limit, "limit")
        seconds = self.settings.llm.organize_budget if budget is None else budget
        if not (isinstance(seconds, int | float) and seconds > 0):
            raise ValidationError("budget must be a positive number of seconds")
        self._await(uid)
        if self.llm is None:
            return EnrichReport(user_id=uid, candidates=0, labelled=0, failed=0, skipped=0, llm_calls=0)
        deadline = time.monotonic() + float(seconds)
        seg = None
        if segment:
            from .organize.segment import segment_tail

            seg = segment_tail(self.store, self.llm, uid, self.settings.tree, deadline=deadline,
                              phrases=self.writer.phrases)
        report = organize_labels(self.store, self.llm, uid, self.settings.tree, limit=limit, deadline=deadline,
                                 phrases=self.writer.phrases)
        return dataclasses.replace(report, segmented=seg)

    def topic_detail(self, topic_id: str, *, user_id: str) -> str | None:
        """A topic's detailed summary (depth 1): made by the LLM on first request and cached
        until the topic changes. None without an LLM or when the call fails."""
        uid = v.user_id(user_id)
        self._await(uid)
        rec = self.store.get_topic(v.item_id(topic_id, "topic_id"))
        if rec is None or rec.user_id != uid:
            raise NotFoundError(f"no topic {topic_id!r}")
        return topic_detail(self.store, self.llm, rec)

    # -- consolidation (organize/consolidate.py) ------------------------------------------------
    @overload
    def consolidate(self, user_id: str, *, options: ConsolidationOptions | None = None) -> ConsolidationReport: ...
    @overload
    def consolidate(self, user_id: None = None, *, options: ConsolidationOptions | None = None
                    ) -> list[ConsolidationReport]: ...
    def consolidate(self, user_id: str | None = None, *, options: ConsolidationOptions | None = None
                    ) -> ConsolidationReport | list[ConsolidationReport]:
        """Merge, link, archive, dedup, mark superseded facts and normalise tags for one user
        (or, with no ``user_id``, every user, returning one report each). Logged and undoable;
        LLM veto calls, when an LLM is configured, are made with no lock held."""
        if user_id is None:
            return [self.consolidate(u, options=options) for u in self.store.list_users()]
        uid = v.user_id(user_id)
        if options is not None and not isinstance(options, ConsolidationOptions):
            raise ValidationError("options must be a ConsolidationOptions or None")
        self._await(uid)
        # Consolidation embeds tags and compares centroids: never with another model's vectors.
        self.writer.check_embedder()
        return consolidate(self.store, self.embedder, uid, self.settings.tree, llm=self.llm, options=options,
                           phrases=self.writer.phrases)

    def read(self, topic_id: str, *, user_id: str, depth: int = 0) -> TopicReading:
        """Read a topic at one of three depths: 0 title and summary, 1 detailed summary (the
        LLM's when configured, else extractive; cached until the topic changes), 2 the
        verbatim exchanges."""
        uid = v.user_id(user_id)
        v.integer(depth, "depth", 0, 2)
        view = self.topic(topic_id, user_id=uid)
        rec = self.store.get_topic(topic_id)
        assert rec is not None
        return read_topic(self.store, self.llm, rec, view, depth)

    def history(self, item_id: str, *, user_id: str | None = None, limit: int = 100) -> list[Change]:
        """Every logged change concerning a topic or exchange (merges, splits, archives,
        links, undos...), newest first; absorbed topic ids are found too."""
        if user_id is not None:
            self._await(v.user_id(user_id))
        return change_history(self.store, v.item_id(item_id, "item_id"),
                              user_id=None if user_id is None else v.user_id(user_id),
                              limit=v.integer(limit, "limit", 1, 100_000))

    def undo(self, change_id: str, *, user_id: str | None = None) -> Change:
        """Reverse a logged merge, archive, dedup, supersession, link or top-level stray's move
        (``rehome``); returns the undo's own log entry. A merge is restored with the absorbed
        topic's original id; an undone move leaves the topic at the top level for good."""
        if user_id is not None:
            self._await(v.user_id(user_id))
        return undo(self.store, v.item_id(change_id, "change_id"), self.settings.tree,
                    user_id=None if user_id is None else v.user_id(user_id), phrases=self.writer.phrases)

    def set_recall_mode(self, topic_id: str, mode: RecallMode, *, user_id: str) -> Topic:
        """``passive`` (always in the recalled context, within its budget share), ``active``
        (recalled when relevant; the default) or ``both``."""
        self._await(v.user_id(user_id))
        set_recall_mode(self.store, v.user_id(user_id), v.item_id(topic_id, "topic_id"), mode, self.settings.tree,
                        self.writer.phrases)
        return self.topic(topic_id, user_id=user_id)

    def pin(self, topic_id: str, *, user_id: str) -> Topic:
        """Keep a topic in every recalled context (recall mode ``both``)."""
        return self.set_recall_mode(topic_id, "both", user_id=user_id)

    def llm_log(self, *, failures_only: bool = False) -> list[LLMCall]:
        """Recent LLM calls (role, model, input size, raw output, error), oldest first."""
        return [] if self.llm is None else self.llm.log(failures_only=failures_only)

    def search(self, query: str, *, user_id: str, limit: int = 10, session_id: str | None = None,
               since: datetime | str | None = None, until: datetime | str | None = None,
               metadata: Mapping[str, Any] | None = None, min_relevance: float | None = None) -> list[Hit]:
        """Ranked exchanges for ``query`` (hybrid lexical + dense, topic-aware); ``[]`` when
        nothing reaches the relevance floor. Filters and ``min_relevance`` as in ``recall``."""
        uid = v.user_id(user_id)
        body = v.text(query, "query", self.settings.max_message_chars)
        v.integer(limit, "limit", 1, 1000)
        where = v.exchange_filter(session_id, since, until, metadata)
        floor = _relevance(min_relevance)
        self._await(uid)
        self.writer.check_embedder()
        return self.retriever.search(uid, body, limit, where, floor)

    def get(self, exchange_id: str, *, user_id: str | None = None) -> Exchange:
        """The exchange with this id; NotFoundError if there is none, or (with ``user_id``)
        if it belongs to another user: existence is never revealed across users."""
        uid = None if user_id is None else v.user_id(user_id)
        ex = self.store.get_exchange(v.item_id(exchange_id, "exchange_id"))
        if ex is None or (uid is not None and ex.user_id != uid):
            raise NotFoundError(f"no exchange {exchange_id!r}")
        return ex

    def exchanges(self, *, user_id: str, status: str | None = None, limit: int | None = None,
                  after_seq: int | None = None) -> list[Exchange]:
        """The user's exchanges in sequence order (optionally by status / after a sequence)."""
        uid = v.user_id(user_id)
        if status is not None and status not in ("pending", "completed", "failed"):
            raise ValidationError("status must be pending, completed, failed or None")
        lim = None if limit is None else v.integer(limit, "limit")
        after = None if after_seq is None else v.integer(after_seq, "after_seq")
        return self.store.list_exchanges(uid, status=status, limit=lim, after_seq=after)  # type: ignore[arg-type]

    def topics(self, *, user_id: str) -> list[Topic]:
        """Every theme and topic of the user (flat, with paths; no children)."""
        root = self.tree(user_id=user_id)
        return [dataclasses.replace(t, children=()) for t in root.walk() if t.kind != "root"]

    def topic(self, topic_id: str, *, user_id: str) -> Topic:
        """One topic (with its path); NotFoundError if the user has no such topic."""
        uid = v.user_id(user_id)
        self._await(uid)
        t = self._topic_view(uid, v.item_id(topic_id, "topic_id"))
        if t is None:
            raise NotFoundError(f"no topic {topic_id!r}")
        return t

    def tree(self, *, user_id: str) -> Topic:
        """The user's topic tree: a root ``Topic`` whose children are the top-level themes."""
        uid = v.user_id(user_id)
        self._await(uid)
        recs = self.store.list_topics(uid)
        kids: dict[str | None, list[TopicRecord]] = {}
        root_rec: TopicRecord | None = None
        for r in recs:
            if r.kind == "root":
                root_rec = r
            kids.setdefault(r.parent_id, []).append(r)

        def build(rec: TopicRecord, depth: int, path: tuple[str, ...]) -> Topic:
            here = path if rec.kind == "root" else (*path, rec.title)
            children = sorted(kids.get(rec.id, []), key=lambda r: (r.start_seq or 0, r.created_seq))
            return _topic(rec, depth, here, tuple(build(c, depth + 1, here) for c in children))

        if root_rec is None:
            root_rec = TopicRecord(id=f"root:{uid}", user_id=uid, kind="root", parent_id=None)
        return build(root_rec, 0, ())

    def _topic_view(self, user_id: str, topic_id: str) -> Topic | None:
        """The topic with its path of titles (None if it is not this user's)."""
        tree = TopicPaths(self.store, user_id)
        rec = tree.record(topic_id)
        if rec is None:
            return None
        path = tree.path(topic_id)
        return _topic(rec, len(path), path, ())

    def stats(self, *, user_id: str) -> Stats:
        uid = v.user_id(user_id)
        self._await(uid)
        counts = self.store.count_exchanges(uid)
        root = self.tree(user_id=uid)
        nodes = root.walk()
        transcript = sum(self.tokens.count(e.text) for e in self.store.iter_exchanges(uid) if e.status == "completed")
        return Stats(
            user_id=uid, exchanges=sum(counts.values()), completed=counts["completed"],
            pending=counts["pending"], failed=counts["failed"],
            topics=sum(1 for t in nodes if t.kind == "topic"),
            themes=sum(1 for t in nodes if t.kind == "theme"), depth=root.height() - 1,
            transcript_tokens=transcript,
            llm_labelled=sum(1 for r in self.store.list_topics(uid) if r.meta.label_source == "llm"),
            llm=None if self.llm is None else self.llm.usage(),
        )

    # -- re-embedding ---------------------------------------------------------------------------
    def reembed(
        self, *, user_id: str | None = None, batch_size: int = 256,
        progress: Callable[[ReembedProgress], None] | None = None, force: bool = False,
    ) -> ReembedReport:
        """Rewrite every stored vector with this Memory's embedder (open the memory with the
        new one): exchange vectors from their text, topic centroids from their members.

        Each user is re-embedded in one store transaction: an embedder failure (an
        ``EmbeddingError``, also for NaN/inf or wrong-sized output) rolls that user back
        untouched. Finished users are recorded in the store, so calling again after an
        interruption skips them. The memory records the new embedder once every user is done;
        until then reads and writes refuse it. With ``user_id`` only that user is done now.
        A memory that already records this embedder is left alone unless ``force``.
        Merged topics' part vectors (consolidation aliases) cannot be rebuilt: they are
        dropped, the topic then scores by its own centroid. ``progress`` gets a
        ``ReembedProgress`` after every batch. Run it while no other process writes
        (``reembed.py``)."""
        # Queued exchanges have no vector to rewrite: placed first (with this embedder).
        self.flush(user_id)
        return reembed(self.writer, user_id=user_id, batch_size=batch_size, progress=progress, force=force)

    # -- deletion -------------------------------------------------------------------------------
    def rebuild_tree(self, user_id: str | None = None) -> dict[str, int]:
        """Rebuild the topic tree of one user (or every user) from the transcript: the stored
        exchanges and vectors are kept, every topic is dropped and each completed exchange is
        placed again in order, as the current placement would have placed it. How a memory
        made by an earlier version gets today's tree; nothing of the transcript changes.
        Consolidation's merges, links and pins live on topics and are dropped with them
        (run ``consolidate`` again). Returns {user: topics after}."""
        self.writer.check_embedder()
        users = [v.user_id(user_id)] if user_id is not None else self.store.list_users()
        out: dict[str, int] = {}
        for uid in users:
            self._await(uid)
            with self.store.transaction(uid):
                exs = self.store.list_exchanges(uid, status="completed")
                vecs = self.store.get_vectors(uid, "exchange", [e.id for e in exs])
                for t in self.store.list_topics(uid):
                    self.store.delete_topic(t.id)
                tree = TreeSession(self.store, uid, self.settings.tree, self.writer.shift, self.writer.phrases)
                for e in exs:
                    vec = vecs.get(e.id)
                    if vec is None:
                        continue
                    # Rows still name the dropped topics until placed: no new topic has their
                    # ids, so spans recomputed meanwhile never count them.
                    topic_id = tree.place(dataclasses.replace(e, topic_id=None), vec, term_counts(e.text))
                    self.store.update_exchange(dataclasses.replace(e, topic_id=topic_id))
                tree.flush()
                out[uid] = sum(1 for t in self.store.list_topics(uid) if t.kind == "topic")
                self.store.log_change(uid, "rebuild", tree.root.id, {"exchanges": len(exs), "topics": out[uid]})
        return out

    def delete(self, exchange_id: str, *, user_id: str | None = None) -> None:
        """Delete one exchange from the transcript, its topic and every index. With
        ``user_id`` an exchange of another user is not found (and not deleted)."""
        ex = self.get(exchange_id, user_id=user_id)
        self._await(ex.user_id, strict=False)
        with self.store.transaction(ex.user_id):
            # Read again under the write lock: the worker may have placed it meanwhile.
            ex = self.store.get_exchange(ex.id) or ex
            self.writer.delete(ex)
            self.store.purge_deleted_text()

    def forget_topic(
        self, topic_id: str, *, user_id: str, confirm: bool = False, dry_run: bool = False,
        expect_exchanges: int | None = None,
    ) -> ForgetReport:
        """Delete every exchange filed under a topic, or under every topic below a theme, and
        report exactly which went (``ForgetReport``: exchange ids and seqs, topics removed).

        A theme holding more than one topic is deleted only with ``confirm=True``; without it
        ``ConfirmationRequired`` is raised, carrying the preview, and nothing changes.
        ``dry_run=True`` returns that preview (``applied=False``) without deleting.
        ``expect_exchanges``, the count a preview showed, makes the call refuse
        (``StateError``) when the topic has gained or lost exchanges since.

        All or nothing, in one transaction: each exchange goes through the same path as
        ``delete`` (tree, vectors, full-text and term statistics kept exact); topics and themes
        left empty are removed, a parent theme too when this was its only content."""
        uid = v.user_id(user_id)
        topic_id = v.item_id(topic_id, "topic_id")
        for name, flag in (("confirm", confirm), ("dry_run", dry_run)):
            if not isinstance(flag, bool):
                raise ValidationError(f"{name} must be true or false")
        if expect_exchanges is not None and (
                not isinstance(expect_exchanges, int) or isinstance(expect_exchanges, bool) or expect_exchanges < 0):
            raise ValidationError("expect_exchanges must be a non-negative integer")
        self._await(uid, strict=False)
        if dry_run:
            return self._forget_plan(uid, topic_id)
        with self.store.transaction(uid):
            # Planned under the user's write lock: exactly these exchanges go.
            plan = self._forget_plan(uid, topic_id)
            if plan.confirm_required and not confirm:
                raise ConfirmationRequired(
                    f"topic {topic_id!r} ({plan.title or 'untitled'}) is a theme: forgetting it deletes "
                    f"{plan.exchange_count} exchanges in {plan.topic_count} topics; confirm to delete them all",
                    plan,
                )
            if expect_exchanges is not None and expect_exchanges != plan.exchange_count:
                raise StateError(
                    f"topic {topic_id!r} now holds {plan.exchange_count} exchanges, not the "
                    f"{expect_exchanges} expected: preview it again"
                )
            before = [r.id for r in self.store.list_topics(uid)]
            for ex in self.store.get_exchanges(uid, list(plan.exchange_ids)):
                self.writer.delete(ex)
            # Reported as it happened, not as planned (the plan trusts the stored sizes).
            after = {r.id for r in self.store.list_topics(uid)}
            removed = tuple(t for t in dict.fromkeys([*plan.removed_topic_ids, *before]) if t not in after)
            # Ids only: a title is made of the forgotten text's words (tests/robust/test_isolation.py).
            self.store.log_change(uid, "forget_topic", topic_id, {
                "exchanges": list(plan.exchange_ids), "seqs": list(plan.seqs), "topics": list(removed),
            })
            self.store.purge_deleted_text()
        return dataclasses.replace(plan, removed_topic_ids=removed, applied=True)

    def _forget_plan(self, uid: str, topic_id: str) -> ForgetReport:
        """What forgetting ``topic_id`` deletes: the exchanges filed under it and the nodes that
        go with them (the node's subtree, and each ancestor that holds nothing else)."""
        if not isinstance(topic_id, str):  # a list or dict id is not a key: NotFound, not TypeError
            raise NotFoundError(f"no topic {topic_id!r}")
        recs = {r.id: r for r in self.store.list_topics(uid)}
        node = recs.get(topic_id)
        if node is None or node.kind == "root":
            raise NotFoundError(f"no topic {topic_id!r}")
        kids: dict[str, list[TopicRecord]] = {}
        for r in recs.values():
            if r.parent_id is not None:
                kids.setdefault(r.parent_id, []).append(r)
        subtree, stack = [], [node.id]
        while stack:  # depth first, children in tree order (as Memory.tree lists them)
            tid = stack.pop()
            subtree.append(tid)
            order = sorted(kids.get(tid, ()), key=lambda r: (r.start_seq or 0, r.created_seq))
            stack.extend(r.id for r in reversed(order))
        members = sorted((e for tid in subtree for e in self.store.list_exchanges(uid, topic_id=tid)),
                         key=lambda e: e.seq)
        # Ancestors left empty go too, as TreeSession.remove drops them: those whose size
        # (completed exchanges placed below) is all inside this subtree.
        placed = sum(1 for e in members if e.status == "completed")
        removed = list(subtree)
        parent = recs.get(node.parent_id) if node.parent_id else None
        while parent is not None and parent.kind != "root" and parent.size <= placed:
            removed.append(parent.id)
            parent = recs.get(parent.parent_id) if parent.parent_id else None
        leaves = sum(1 for tid in subtree if recs[tid].kind == "topic")
        view = self._topic_view(uid, topic_id)
        return ForgetReport(
            topic_id=node.id, kind=node.kind, title=node.title, path=view.path if view else (),
            exchange_ids=tuple(e.id for e in members), seqs=tuple(e.seq for e in members),
            exchange_count=len(members), topic_count=leaves, removed_topic_ids=tuple(removed),
            confirm_required=leaves > 1, applied=False,
        )

    def delete_user(self, user_id: str) -> int:
        """Delete every exchange, topic, index entry and log row of a user; returns the count."""
        try:
            uid = v.user_id(user_id)
        except ValidationError:
            # A user stored before the one user-id rule (docs/doors.md) can still be deleted,
            # never read or written.
            if not isinstance(user_id, str) or user_id not in self.store.list_users():
                raise
            uid = user_id
        n = self.store.delete_user(uid)
        if self.llm is not None:  # the LLM call log may quote the user's text
            self.llm.clear_log()
        return n


def _relevance(value: object) -> float | None:
    """A ``min_relevance`` argument: None (the setting) or a finite number >= 0."""
    return _non_negative(value, "min_relevance must be a finite number >= 0")


def _non_negative(value: object, message: str) -> float | None:
    """None, or a finite number >= 0 as a float (``ValidationError(message)`` otherwise)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValidationError(message)
    return float(value)


def _content_hash(ex: Exchange, item: Mapping[str, Any]) -> str:
    """What makes an imported exchange the same one again: its messages, session and the
    times the item gave (an item without times gets "now", which must not make a re-import
    of the same file differ). Metadata is not part of it."""
    given = {"messages": list(ex.messages), "session_id": ex.session_id,
             "at": ex.user_at.isoformat() if item.get("at") is not None else None,
             "assistant_at": ex.assistant_at.isoformat()
             if item.get("assistant_at") is not None and ex.assistant_at is not None else None}
    raw = json.dumps(given, ensure_ascii=False, sort_keys=True, default=str)
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def _skipped(found: Mapping[int, str]) -> tuple[SkippedItem, ...]:
    return tuple(SkippedItem(index=i, exchange_id=x) for i, x in sorted(found.items()))


def _topic(rec: TopicRecord | Topic, depth: int, path: tuple[str, ...], children: tuple[Topic, ...]) -> Topic:
    head = rec.head() if isinstance(rec, TopicRecord) else rec
    return dataclasses.replace(head, depth=depth, path=path, children=children)
