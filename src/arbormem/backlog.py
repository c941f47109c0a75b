"""Background placement: completed exchanges waiting to be embedded and placed.

With ``Settings.placement = "background"``, ``Memory.complete`` stores the reply (status
``completed``, no topic) in one transaction and returns; this module embeds and places such
exchanges later, in batches, through the one write path (``ingest.Unit``, as ``add_many``
does). Single-text embedding costs about as much as one text of a batch, so a tight
``begin``/``complete`` loop ingests at batch speed once the queue grows, and in a chat app the
worker runs while the LLM writes the next answer.

The queue is the store itself: **a completed exchange without a topic is queued** (it has no
vector and no full-text entry yet; ``Store.unplaced`` finds them through the (user, topic, seq)
index). Nothing else records it, so a crash after ``complete`` returned loses nothing: the
next ``Memory`` to use that user places what it finds (``Backlog.wait`` consults the store on
the first use of every user), and ``arbormem check`` counts such exchanges as queued, not
corrupt. No schema change was needed: before this, a completed exchange always had a topic.

Who places: one placer at a time per ``Memory`` (``_place_lock``): the worker thread (started
lazily by the first queued completion), or a caller that must see the tree (``wait``), which
waits for the batch in progress and then places the rest itself. Each batch is embedded with
no store lock held, then placed in one transaction that first re-reads its rows: an exchange
another process placed (or deleted) meanwhile is skipped, so none is ever placed twice.

Failures: an embedder or store failure places nothing of the batch (the transaction rolls
back, the rows stay queued), is logged and kept in ``failures``; the worker does not retry on
its own but on the next completion or wait, and ``wait``/``Memory.flush`` raise it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np

from .errors import StateError
from .ingest import Writer
from .models import Exchange

log = logging.getLogger("arbormem.backlog")

#: Failures kept for ``Memory.placement_errors`` (the newest).
_FAILURES_KEPT = 50


@dataclass(frozen=True)
class PlacementFailure:
    """A batch of queued exchanges that could not be placed (they stay queued)."""

    user_id: str
    exchange_ids: tuple[str, ...]
    error: str
    at: datetime


def length_groups(lengths: list[int], waste: float = 0.1) -> list[list[int]]:
    """Indexes grouped by length, longest first, so that padding every member of a group to
    its longest adds at most ``waste`` of the group's own length (characters stand in for
    tokens). 0.1 measured best of 0.1/0.25/0.5 on LoCoMo-derived and synthetic texts."""
    out: list[list[int]] = []
    group: list[int] = []
    total = 0
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        if group and lengths[group[0]] * (len(group) + 1) > (1 + waste) * (total + lengths[i]):
            out.append(group)
            group, total = [], 0
        group.append(i)
        total += lengths[i]
    if group:
        out.append(group)
    return out


class Backlog:
    """The placement queue of one ``Memory``: its worker thread and the waits of readers."""

    def __init__(self, writer: Writer, *, batch: int, close_timeout: float) -> None:
        self.writer = writer
        self.store = writer.store
        self.batch = batch
        self.close_timeout = close_timeout
        self.failures: deque[PlacementFailure] = deque(maxlen=_FAILURES_KEPT)
        self._place_lock = threading.Lock()  # one placer at a time in this Memory
        self._state = threading.Condition()  # guards everything below
        # Completions this Memory queued, per user, and the count at which the user's queue
        # was last seen empty in the store: equal means a read need not look again.
        self._queued: dict[str, int] = {}
        self._clean: dict[str, int] = {}
        self._wake: dict[str, None] = {}  # users the worker should look at, oldest first
        self._thread: threading.Thread | None = None
        self._closing = False
        self._stopped = False
        self._pool: ThreadPoolExecutor | None = None  # the embedding thread, made on first use

    # -- producers --------------------------------------------------------------------------------
    def queued(self, user_id: str) -> None:
        """Note a completion stored without placement (after its commit) and wake the worker."""
        with self._state:
            if self._closing:
                return  # closing: it stays queued in the store for the next open
            self._queued[user_id] = self._queued.get(user_id, 0) + 1
            self._wake[user_id] = None
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="arbormem-placement", daemon=True)
                self._thread.start()
            self._state.notify()

    # -- consumers ----------------------------------------------------------------------------------
    def wait(self, user_id: str, *, timeout: float | None = None, force: bool = False) -> None:
        """Place the user's queue before a read: wait for the worker's batch in progress (at
        most ``timeout`` seconds), then place what is left in this thread. Without ``force``
        the store is only consulted when this Memory queued something since it last found the
        user's queue empty, or on the user's first use (a crashed process may have left some).
        Raises what the placement raised (the exchanges stay queued)."""
        if not force:
            with self._state:
                if self._clean.get(user_id, -1) == self._queued.get(user_id, 0):
                    return
        # A timeout past the platform's maximum means "no timeout" (acquire would overflow).
        limit = -1 if timeout is None or timeout >= threading.TIMEOUT_MAX else max(timeout, 0.0)
        if not self._place_lock.acquire(timeout=limit):
            raise StateError(f"the queued exchanges of {user_id!r} were not placed within {timeout} s")
        try:
            while self._drain(user_id):
                pass
        finally:
            self._place_lock.release()

    def pending_users(self) -> list[str]:
        """Users this Memory knows to have exchanges queued (or not yet checked since queued)."""
        with self._state:
            return [u for u, n in self._queued.items() if self._clean.get(u, -1) != n]

    def _drain(self, user_id: str, max_batches: int | None = None) -> bool:
        """Place the user's queue batch by batch (call holding ``_place_lock``), at most
        ``max_batches``; the next batch is embedded on the embedding thread while this one is
        placed (the model works outside the GIL, placement inside it: on two cores they
        overlap). False when the queue was found empty, True when it may hold more."""
        with self._state:
            seen = self._queued.get(user_id, 0)
        batch = self.store.unplaced(user_id, self.batch)
        if not batch:
            with self._state:
                # Every completion counted in ``seen`` committed before the query above.
                self._clean[user_id] = max(seen, self._clean.get(user_id, -1))
            return False
        pool = self._embedding_pool()
        fut: Future[list[np.ndarray]] | None = pool.submit(self._embed, [e.text for e in batch])
        done = 0
        try:
            while fut is not None:
                try:
                    vecs = fut.result()
                except Exception as exc:
                    self._failed(user_id, batch, exc)
                    raise
                done += 1
                nxt = [] if max_batches is not None and done >= max_batches else \
                    self.store.unplaced(user_id, self.batch, after_seq=batch[-1].seq)
                fut = pool.submit(self._embed, [e.text for e in nxt]) if nxt else None
                self._place(user_id, batch, vecs)
                batch = nxt
        finally:
            if fut is not None:
                fut.cancel()  # a placement failed: the next batch's vectors are not used
        return True

    def _embedding_pool(self) -> ThreadPoolExecutor:
        with self._state:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arbormem-embed")
            return self._pool

    def _failed(self, user_id: str, batch: list[Exchange], exc: BaseException) -> None:
        failure = PlacementFailure(user_id, tuple(e.id for e in batch), f"{type(exc).__name__}: {exc}",
                                   datetime.now(timezone.utc))
        self.failures.append(failure)
        log.warning("placing %d queued exchange(s) of %r failed (they stay queued): %s",
                    len(batch), user_id, failure.error)

    def _place(self, user_id: str, batch: list[Exchange], vecs: list[np.ndarray]) -> None:
        """Place in one transaction those of ``batch`` (seq order, embedded as ``vecs``) still
        queued. Any failure is recorded and raised; nothing of the batch is placed then."""
        try:
            # Bound only now, after the embedder answered (ingest.py: a failing embedder leaves
            # a fresh memory unbound).
            self.writer.check_embedder()
            ids = [e.id for e in batch]
            with self.store.transaction(user_id):
                # Re-read under the user's write lock: another process (or a repair) may have
                # placed or deleted some since the batch was read.
                now = {e.id: e for e in self.store.get_exchanges(user_id, ids)}
                placed = self.store.get_vectors(user_id, "exchange", ids)
                queued = [e for e in batch if e.id in now and now[e.id].status == "completed"
                          and now[e.id].topic_id is None]
                # A vector without a topic is no state this code leaves (damage, or a writer
                # around the store): never placed over, and reported instead of looped on.
                damaged = [e.id for e in queued if e.id in placed]
                ok = {e.id for e in queued if e.id not in placed}
                todo = [(now[e.id], v) for e, v in zip(batch, vecs, strict=True) if e.id in ok]
                if todo:
                    unit = self.writer.unit(user_id)
                    for ex, vec in todo:
                        unit.add(ex, vec, update=True)
                    unit.finish()
            if damaged:
                raise StateError(f"{len(damaged)} completed exchange(s) of {user_id!r} have a vector but no "
                                 f"topic (e.g. {damaged[0]}); run `arbormem check --repair`")
        except Exception as exc:
            self._failed(user_id, batch, exc)
            raise

    def _embed(self, texts: list[str]) -> list[np.ndarray]:
        """Vectors of ``texts`` in order. An embedder that pads its batches gets groups of
        similar length (``length_groups``): a batch is whatever the queue held, unsorted, and
        one long text padded the whole of it (LoCoMo-derived texts: 15 texts/s for batches of
        64 as they came, 44/s grouped, 33/s one by one; BENCHMARKS.md)."""
        embedder = self.writer.embedder
        if not embedder.pads_batches:
            return list(embedder.embed(texts))
        out: list[np.ndarray] = [np.empty(0)] * len(texts)
        for group in length_groups([len(t) for t in texts]):
            for i, vec in zip(group, embedder.embed([texts[i] for i in group]), strict=True):
                out[i] = vec
        return out

    # -- the worker -------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._state:
                while not self._wake and not self._closing:
                    self._state.wait()
                if not self._wake or self._stopped:
                    return
                user_id = next(iter(self._wake))
                del self._wake[user_id]
            with self._place_lock:
                if self._stopped:
                    return
                try:
                    # A few batches per turn, then the lock is free for a waiting reader.
                    more = self._drain(user_id, max_batches=4)
                except Exception:  # recorded and logged; retried on the next signal
                    continue
            if more:
                with self._state:
                    self._wake.setdefault(user_id, None)

    def close(self) -> None:
        """Let the worker place what it was woken for, for at most ``close_timeout`` seconds,
        then stop it (what is left stays queued in the store)."""
        with self._state:
            self._closing = True
            thread = self._thread
            self._state.notify_all()
        if thread is None:
            self._shutdown_pool()
            return
        deadline = time.monotonic() + self.close_timeout
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            with self._state:
                self._stopped = True
            log.warning("closing with queued exchanges still being placed after %.0f s; "
                        "they stay queued and are placed on the next use", self.close_timeout)
            # The batch in progress may still be running: wait for it (not for the rest), so
            # the store is not closed under its transaction.
            with self._place_lock:
                pass
        self._shutdown_pool()

    def _shutdown_pool(self) -> None:
        with self._state:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


__all__ = ["Backlog", "PlacementFailure", "length_groups"]
