"""The Store contract: everything arbormem persists, behind one small interface.

A store keeps, per ``user_id`` partition: the verbatim exchanges, the topic tree, a vector
index and a lexical (full-text) index over exchanges and topics, and an audit log of tree
changes. Every method is scoped by user; a store never returns one user's rows for another.

Atomicity: ``transaction(user_id)`` serialises writers of that user (SQLite: the database
write lock; PostgreSQL: a transaction plus an advisory lock per user). Calls made inside it
commit or roll back together; calls outside it commit on their own. Nested use joins the outer
transaction.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, NamedTuple

import numpy as np

from ..models import Exchange, Status, Topic, TopicKind
from .state import MARKS_KEY, TopicMeta

IndexKind = Literal["exchange", "topic"]


class TopicShape(NamedTuple):
    """The part of a topic node placement compares (``Store.topic_shapes``): read-only."""

    id: str
    kind: TopicKind
    parent_id: str | None
    size: int
    vec_sum: np.ndarray | None
    no_merge: bool


@dataclass
class TopicRecord:
    """A topic tree node as stored (mutable working copy; the public view is ``Topic``).

    ``vec_sum`` is the sum of the unit vectors of every exchange below the node, so centroids
    update incrementally; ``terms`` holds term counts of the node's own text (leaves) used for
    keywords and titles. ``meta`` is the typed rest of its state (``store/state.py``).
    """

    id: str
    user_id: str
    kind: TopicKind
    parent_id: str | None
    title: str = ""
    keywords: list[str] = field(default_factory=list)
    summary: str = ""
    start_seq: int | None = None
    end_seq: int | None = None
    size: int = 0
    first_at: datetime | None = None
    last_at: datetime | None = None
    frozen: bool = False
    vec_sum: np.ndarray | None = None
    terms: dict[str, int] = field(default_factory=dict)
    created_seq: int = 0
    meta: TopicMeta = field(default_factory=TopicMeta)

    def shape(self) -> TopicShape:
        """The node as placement compares it (``Store.topic_shapes``)."""
        return TopicShape(self.id, self.kind, self.parent_id, self.size, self.vec_sum, bool(self.meta.no_merge))

    def head(self) -> Topic:
        """The node as the public ``Topic`` (no path, children or depth: the reader adds those)."""
        return Topic(self.id, self.user_id, self.kind, self.parent_id, self.title, tuple(self.keywords),
                     self.summary, self.start_seq, self.end_seq, self.size, self.first_at, self.last_at,
                     self.frozen)

    def centroid(self) -> np.ndarray | None:
        if self.vec_sum is None:
            return None
        norm = float(np.linalg.norm(self.vec_sum))
        if norm == 0.0:
            return None
        return (self.vec_sum / norm).astype(np.float32)


@dataclass(frozen=True)
class ChangeRecord:
    """One logged change of the tree (placement, split, merge, archive, ...)."""

    id: str
    user_id: str
    at: datetime
    action: str
    target_id: str
    detail: dict[str, Any]


@dataclass(frozen=True)
class ExchangeHead:
    """The fields recall needs to score an exchange, without its text (cheap to fetch)."""

    id: str
    seq: int
    session_id: str | None
    topic_id: str | None
    user_at: datetime
    status: Status
    archived: bool
    #: Only the organiser's marks (``metadata["_arbormem"]``: superseded_by, ...), if any.
    metadata: Mapping[str, Any] = field(default_factory=dict)


class ExchangeText(NamedTuple):
    """An exchange's two texts and, when the store keeps it, ``text.token_record`` of them
    (written with the texts; None: rows written before it was kept, or by a bulk path, and
    the reader tokenises the texts itself)."""

    user: str
    assistant: str
    tokens: str | None = None


#: What a metadata filter may compare: JSON scalars.
MetaValue = str | int | float | bool | None


@dataclass(frozen=True)
class ExchangeFilter:
    """Which exchanges a search may return: all conditions hold (issue 18).

    ``session_id`` equal; ``since <= user_at < until`` (either end open when None); every
    ``metadata`` key present with an equal JSON scalar (numbers compare as numbers, ``True``
    is not ``1``, ``None`` matches a stored ``null``). Stores apply it inside their queries
    (exchange kind only; topics are never filtered), so a filtered search ranks within the
    matching exchanges rather than dropping rows from an unfiltered top-k.
    """

    session_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    metadata: Mapping[str, MetaValue] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.session_id is not None or self.since is not None or self.until is not None
                    or self.metadata)

    def matches(self, ex: Exchange) -> bool:
        """The same conditions over one exchange in memory (for the few rows recall adds
        itself, such as a pinned topic's exchanges; candidate search filters in the store)."""
        if self.session_id is not None and ex.session_id != self.session_id:
            return False
        if self.since is not None and ex.user_at < self.since:
            return False
        if self.until is not None and ex.user_at >= self.until:
            return False
        return all(key in ex.metadata and meta_equal(ex.metadata[key], want)
                   for key, want in self.metadata.items())


def meta_equal(have: Any, want: MetaValue) -> bool:
    """JSON scalar equality as the stores compute it: bools only equal bools, numbers by value."""
    if isinstance(want, bool) or isinstance(have, bool):
        return isinstance(want, bool) and isinstance(have, bool) and have is want
    if want is None:
        return have is None
    if isinstance(want, (int, float)):
        return isinstance(have, (int, float)) and have == want
    return isinstance(have, str) and have == want


class Store(ABC):
    """Persistence contract implemented by SQLiteStore and PostgresStore."""

    def reads_alongside(self) -> bool:
        """Capability: whether a read from another thread, started now, would see what this
        thread sees (no transaction open here) and run alongside this thread's work. Recall
        then runs its lexical searches while the query is embedded. Off by default."""
        return False

    # -- lifecycle ---------------------------------------------------------------------------
    @abstractmethod
    def transaction(self, user_id: str) -> AbstractContextManager[None]:
        """Serialise this user's writers; everything inside commits or rolls back together."""

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def get_meta(self, key: str) -> str | None: ...

    @abstractmethod
    def set_meta(self, key: str, value: str) -> None: ...

    # -- exchanges ---------------------------------------------------------------------------
    @abstractmethod
    def next_seq(self, user_id: str) -> int:
        """Allocate the user's next sequence number (call inside ``transaction``)."""

    @abstractmethod
    def insert_exchange(self, ex: Exchange) -> None:
        """Store a new exchange row, and raise the user's sequence counter to at least its
        ``seq`` (an imported memory continues after its highest; ``add_many`` allocates one
        number per call and numbers the rest after it)."""

    @abstractmethod
    def update_exchange(self, ex: Exchange) -> None:
        """Overwrite the mutable fields (status, messages, texts, times, topic, failure...)."""

    @abstractmethod
    def get_exchange(self, exchange_id: str) -> Exchange | None: ...

    @abstractmethod
    def get_exchanges(self, user_id: str, ids: Sequence[str]) -> list[Exchange]:
        """The user's exchanges with these ids, in sequence order (unknown ids skipped)."""

    @abstractmethod
    def list_exchanges(
        self,
        user_id: str,
        *,
        status: Status | None = None,
        topic_id: str | None = None,
        after_seq: int | None = None,
        limit: int | None = None,
        newest_first: bool = False,
        where: ExchangeFilter | None = None,
    ) -> list[Exchange]: ...

    def exchange_heads(self, user_id: str, ids: Sequence[str]) -> list[ExchangeHead]:
        """Scoring fields of the user's exchanges with these ids (stores may override cheaply)."""
        return [ExchangeHead(e.id, e.seq, e.session_id, e.topic_id, e.user_at, e.status, e.archived,
                             {MARKS_KEY: e.metadata[MARKS_KEY]} if MARKS_KEY in e.metadata else {})
                for e in self.get_exchanges(user_id, ids)]

    def exchange_texts(self, user_id: str, ids: Sequence[str]) -> dict[str, ExchangeText]:
        """The texts of the user's exchanges with these ids (unknown ids skipped), and their
        tokens where the store keeps them: what recall's coverage and feedback steps read,
        without the messages and metadata to decode (stores may override cheaply)."""
        return {e.id: ExchangeText(e.user_text, e.assistant_text) for e in self.get_exchanges(user_id, ids)}

    def heads_by_seq(self, user_id: str, seqs: Sequence[int],
                     where: ExchangeFilter | None = None) -> list[ExchangeHead]:
        """Scoring fields of the user's exchanges with these sequence numbers (recall's
        neighbours: most are only scored, never shown; stores may override cheaply)."""
        return [ExchangeHead(e.id, e.seq, e.session_id, e.topic_id, e.user_at, e.status, e.archived,
                             {MARKS_KEY: e.metadata[MARKS_KEY]} if MARKS_KEY in e.metadata else {})
                for e in self.exchanges_by_seq(user_id, seqs, where)]

    def exchanges_by_seq(self, user_id: str, seqs: Sequence[int],
                         where: ExchangeFilter | None = None) -> list[Exchange]:
        """The user's exchanges with these sequence numbers (stores may override with one query)."""
        out: list[Exchange] = []
        for s in sorted(set(seqs)):
            out.extend(e for e in self.list_exchanges(user_id, after_seq=s - 1, limit=1, where=where)
                       if e.seq == s)
        return out

    def unplaced(self, user_id: str, limit: int, after_seq: int = 0) -> list[Exchange]:
        """The user's first ``limit`` completed exchanges after ``after_seq`` that have no
        topic yet, in sequence order: the queue of background placement (``backlog.py``; such
        an exchange has no vector and no full-text entry either). Stores override this
        default, which reads every completed exchange, with a query on the (user, topic, seq)
        index."""
        return [e for e in self.list_exchanges(user_id, status="completed", after_seq=after_seq)
                if e.topic_id is None][:limit]

    @abstractmethod
    def iter_exchanges(self, user_id: str, batch: int = 1000) -> Iterator[Exchange]:
        """Every exchange of the user in sequence order, fetched in batches."""

    @abstractmethod
    def delete_exchange(self, exchange_id: str) -> None:
        """Remove the exchange row and its index entries."""

    @abstractmethod
    def count_exchanges(self, user_id: str | None) -> dict[str, int]:
        """Counts by status (all users when ``user_id`` is None)."""

    # -- topics ------------------------------------------------------------------------------
    @abstractmethod
    def put_topic(self, rec: TopicRecord) -> None:
        """Insert or replace a topic node."""

    @abstractmethod
    def get_topic(self, topic_id: str) -> TopicRecord | None: ...

    def topic_shapes(self, user_id: str, *, ids: Sequence[str] | None = None,
                     parent_id: str | None = None) -> dict[str, TopicShape]:
        """What placement compares of the user's topics among ``ids`` (or the children of
        ``parent_id``): kind, parent, size, vector sum and the merge veto, without decoding
        term counts, phrases and the rest of ``meta`` (a placement looks at two dozen
        candidates and their themes; decoding them whole was most of its cost). Stores
        override this default, which reads whole records."""
        if ids is not None:
            recs = list(self.get_topics(user_id, ids).values())
        else:
            recs = [r for r in self.list_topics(user_id, parent_id=parent_id) if parent_id is not None]
        return {r.id: r.shape() for r in recs}

    def get_topics(self, user_id: str, ids: Sequence[str]) -> dict[str, TopicRecord]:
        """The user's topics among ``ids``, by id (others' and unknown ids are left out).

        Recall resolves a few dozen topics and their ancestors per call: one query per tree
        level rather than one per node (a round trip each on PostgreSQL). Stores override
        this default, which looks them up one by one."""
        out = {}
        for tid in dict.fromkeys(ids):
            rec = self.get_topic(tid)
            if rec is not None and rec.user_id == user_id:
                out[tid] = rec
        return out

    def topic_heads(self, user_id: str, ids: Sequence[str]) -> dict[str, Topic]:
        """The user's nodes with these ids, as heads (stores may override cheaply)."""
        return {i: r.head() for i, r in self.get_topics(user_id, ids).items()}

    def topic_links(self, user_id: str, ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """The consolidation links (``meta.links``) of the user's topics among ``ids``, by id
        (others' and unknown ids are left out). Recall follows the links of its strongest
        topics on every query; stores may override this default, which reads whole records."""
        return {i: tuple(r.meta.links) for i, r in self.get_topics(user_id, ids).items()}

    @abstractmethod
    def list_topics(self, user_id: str, parent_id: str | None | Literal["*"] = "*") -> list[TopicRecord]:
        """The user's topics; ``parent_id=None`` gives the top level, ``"*"`` all of them."""

    @abstractmethod
    def delete_topic(self, topic_id: str) -> None: ...

    # -- indexes -----------------------------------------------------------------------------
    @abstractmethod
    def put_vectors(self, user_id: str, kind: IndexKind, ids: Sequence[str], vectors: np.ndarray) -> None:
        """Insert or replace unit vectors (float32 rows) for these ids."""

    @abstractmethod
    def get_vectors(self, user_id: str, kind: IndexKind, ids: Sequence[str]) -> dict[str, np.ndarray]: ...

    @abstractmethod
    def vector_search(self, user_id: str, kind: IndexKind, query: np.ndarray, k: int,
                      where: ExchangeFilter | None = None) -> list[tuple[str, float]]:
        """Top-k ids by cosine similarity to the unit vector ``query`` (exchanges: among those
        ``where`` admits)."""

    @abstractmethod
    def put_text(self, user_id: str, kind: IndexKind, item_id: str, text: str) -> None:
        """Insert or replace the full-text index entry of an item."""

    @abstractmethod
    def text_search(self, user_id: str, kind: IndexKind, terms: Sequence[str], k: int,
                    where: ExchangeFilter | None = None) -> list[tuple[str, float]]:
        """Top-k ids by BM25 over any of ``terms`` (higher score = better; exchanges: among
        those ``where`` admits)."""

    @abstractmethod
    def delete_index(self, kind: IndexKind, item_id: str) -> None:
        """Remove an item from both the vector and the text index."""

    # -- term statistics (document frequencies for keywords and query weighting) -------------
    @abstractmethod
    def add_term_df(self, user_id: str, terms: Sequence[str], delta: int = 1) -> None:
        """Add ``delta`` to the document frequency of each (distinct) term of the user."""

    def add_term_counts(self, user_id: str, deltas: Mapping[str, int]) -> None:
        """Add a per-term increment (a batch's document frequencies): one ``add_term_df``
        call per distinct increment, not one per document."""
        by_delta: dict[int, list[str]] = {}
        for term, n in deltas.items():
            by_delta.setdefault(n, []).append(term)
        for n, group in sorted(by_delta.items()):
            self.add_term_df(user_id, group, delta=n)

    # -- bulk loading (eval/scale.py; imports of whole histories) --------------------------
    def load_exchanges(self, user_id: str, exchanges: Sequence[Exchange], vectors: np.ndarray,
                       keys: Sequence[str]) -> None:
        """Write completed exchanges of ``user_id``, in sequence order after those it holds,
        with their vectors and lexical keys (one row each), in one transaction; the caller
        places them (``topic_id``) and adds their term statistics (``add_term_counts``). Call
        ``finish_load`` after the last ``load_*``. Through the contract by default; a store
        may write the rows its own faster way (PostgreSQL: COPY)."""
        ids = [ex.id for ex in exchanges]
        with self.transaction(user_id):
            for ex in exchanges:
                self.insert_exchange(ex)
            self.put_vectors(user_id, "exchange", ids, vectors)
            for i, key in zip(ids, keys, strict=True):
                self.put_text(user_id, "exchange", i, key)

    def load_topics(self, user_id: str, topics: Sequence[TopicRecord], texts: Mapping[str, str]) -> None:
        """Write tree nodes of ``user_id`` (the root included) with their centroid vectors and
        the index texts in ``texts`` (by topic id; the root has none), in one transaction."""
        indexed = [r for r in topics if r.id in texts]
        with self.transaction(user_id):
            for rec in topics:
                self.put_topic(rec)
            with_vec = [(r.id, c) for r in indexed if (c := r.centroid()) is not None]
            if with_vec:
                self.put_vectors(user_id, "topic", [i for i, _ in with_vec], np.stack([c for _, c in with_vec]))
            for r in indexed:
                self.put_text(user_id, "topic", r.id, texts[r.id])

    def finish_load(self, user_id: str) -> None:  # noqa: B027 - optional hook, a no-op by default
        """After bulk loading: build what the store builds once over all rows (PostgreSQL:
        the HNSW index and planner statistics)."""

    @abstractmethod
    def get_term_df(self, user_id: str, terms: Sequence[str]) -> dict[str, int]:
        """Document frequency of each known term (unknown terms are left out)."""

    # -- users and audit ---------------------------------------------------------------------
    @abstractmethod
    def list_users(self) -> list[str]: ...

    @abstractmethod
    def delete_user(self, user_id: str) -> int:
        """Remove every row of the user from every table and index; returns exchanges removed."""

    def purge_deleted_text(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Physically drop the text of deleted index entries where the backend keeps it after a
        delete (SQLite's FTS5 keeps deleted tokens in old index segments until they merge).
        Called inside the deleting transaction."""

    @abstractmethod
    def log_change(self, user_id: str, action: str, target_id: str, detail: dict[str, Any]) -> str: ...

    @abstractmethod
    def list_changes(self, user_id: str, target_id: str | None = None, limit: int = 100) -> list[ChangeRecord]: ...
