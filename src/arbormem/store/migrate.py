"""Copy a whole memory from one store to another, losslessly, and prove it.

    report = copy_store(SQLiteStore("memory.db"), PostgresStore(url))
    assert report.ok, report.mismatches

Everything of every user is copied: exchanges (verbatim, same ids and sequence numbers), the
topic tree (same ids, insertion order, centroid sums), vectors, text-index entries, term
document frequencies, the change log (same ids and times), each user's sequence counter, and
the store's meta keys (so ``Memory`` recognises the embedder). Afterwards both stores are read
back and compared section by section with counts and SHA-256 checksums over a canonical form;
the result is a typed ``MigrationReport``.

The ``Store`` contract has no readers for the text index, the term table, the sequence counter
or the meta table, and no way to insert a change with its original id and time. A store
offers them through the optional ``Exportable`` methods below (``PostgresStore`` does);
``SQLiteStore`` is served by a small adapter over its tables until it grows them.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

import numpy as np

from ..errors import StateError, StoreError
from ..models import Exchange, Serializable
from .base import ChangeRecord, IndexKind, Store, TopicRecord

#: progress(stage, done, total): stage is "exchanges", "topics", ... prefixed by the user id.
ProgressFn = Callable[[str, int, int], None]

_KINDS: tuple[IndexKind, ...] = ("exchange", "topic")
# Meta keys describing one backend's physical layout, not the memory: never copied.
_LOCAL_META = frozenset({"pg_vector_dims"})
SECTIONS = ("exchanges", "topics", "vectors", "text", "term_df", "changes", "last_seq")


class Exportable(Protocol):
    """Optional bulk methods a store offers for lossless copies (proposed contract addition)."""

    def iter_text(self, user_id: str, kind: IndexKind) -> Iterable[tuple[str, str]]: ...
    def iter_vector_ids(self, user_id: str, kind: IndexKind) -> list[str]: ...
    def iter_term_df(self, user_id: str) -> list[tuple[str, int]]: ...
    def iter_meta(self) -> list[tuple[str, str]]: ...
    def get_last_seq(self, user_id: str) -> int: ...
    def ensure_seq(self, user_id: str, seq: int) -> None: ...
    def put_change(self, rec: ChangeRecord) -> None: ...


@dataclass(frozen=True)
class UserReport(Serializable):
    """What was copied for one user: counts and checksums per section, on both sides."""

    user_id: str
    counts: dict[str, int]
    checksums: dict[str, str]
    mismatches: tuple[str, ...] = ()


@dataclass(frozen=True)
class MigrationReport(Serializable):
    """Result of ``copy_store``; ``ok`` is True when every section matched on both sides."""

    source: str
    destination: str
    users: tuple[UserReport, ...]
    meta_keys: tuple[str, ...]
    seconds: float
    mismatches: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.mismatches

    @property
    def totals(self) -> dict[str, int]:
        out = dict.fromkeys(SECTIONS[:-1], 0)
        for u in self.users:
            for k in out:
                out[k] += u.counts.get(k, 0)
        return out


def exporter(store: Store) -> Exportable:
    """The store itself, when it implements ``Exportable`` (both bundled stores do)."""
    if all(hasattr(store, m) for m in ("iter_text", "iter_vector_ids", "iter_term_df", "iter_meta",
                                       "get_last_seq", "ensure_seq", "put_change")):
        return store  # type: ignore[return-value]
    raise StoreError(f"{type(store).__name__} cannot be copied: it lacks the Exportable methods")


# -- canonical forms for checksums --------------------------------------------------------------
def _ts(value: datetime | None) -> str | None:
    if value is None:
        return None
    # naive datetimes are UTC by convention (PostgreSQL stores them so)
    aware = value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
    return aware.astimezone(timezone.utc).isoformat()


def _dump(value: Any) -> str:
    # Key order is kept (not sorted): both stores keep JSON verbatim, so order is checked too.
    return json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))


def _canon_exchange(e: Exchange) -> str:
    return _dump([e.id, e.user_id, e.session_id, e.seq, e.status, list(e.messages), e.user_text,
                  e.assistant_text, _ts(e.user_at), _ts(e.assistant_at), dict(e.metadata),
                  e.topic_id, e.failure, e.archived])


def _canon_topic(t: TopicRecord) -> str:
    vec = None if t.vec_sum is None else np.asarray(t.vec_sum, dtype=np.float32).tobytes().hex()
    return _dump([t.id, t.user_id, t.kind, t.parent_id, t.title, list(t.keywords), t.summary,
                  t.start_seq, t.end_seq, t.size, _ts(t.first_at), _ts(t.last_at), t.frozen, vec,
                  dict(t.terms), t.created_seq, t.meta.encode()])


def _canon_change(c: ChangeRecord) -> str:
    return _dump([c.id, c.user_id, _ts(c.at), c.action, c.target_id, c.detail])


class _Digest:
    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.n = 0

    def add(self, item: str | bytes) -> None:
        data = item.encode("utf-8") if isinstance(item, str) else item
        self.h.update(len(data).to_bytes(8, "little"))
        self.h.update(data)
        self.n += 1

    def hexdigest(self) -> str:
        return self.h.hexdigest()


def _all_changes(store: Store, user_id: str) -> list[ChangeRecord]:
    return list(reversed(store.list_changes(user_id, limit=2**62)))  # oldest first


def _chunks(items: Sequence[str], n: int) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def fingerprint(store: Store, user_id: str, batch: int = 1000) -> tuple[dict[str, int], dict[str, str]]:
    """Counts and SHA-256 checksums of every section of one user's memory."""
    ex = exporter(store)
    digests = {s: _Digest() for s in SECTIONS}
    for e in store.iter_exchanges(user_id, batch=batch):
        digests["exchanges"].add(_canon_exchange(e))
    for t in store.list_topics(user_id):
        digests["topics"].add(_canon_topic(t))
    for kind in _KINDS:
        ids = ex.iter_vector_ids(user_id, kind)
        for chunk in _chunks(ids, batch):
            vecs = store.get_vectors(user_id, kind, chunk)
            for i in chunk:
                digests["vectors"].add(f"{kind}\x00{i}\x00".encode() + vecs[i].astype(np.float32).tobytes())
        for item_id, body in ex.iter_text(user_id, kind):
            digests["text"].add(f"{kind}\x00{item_id}\x00{body}")
    for term, df in ex.iter_term_df(user_id):
        digests["term_df"].add(f"{term}\x00{df}")
    for c in _all_changes(store, user_id):
        digests["changes"].add(_canon_change(c))
    digests["last_seq"].add(str(ex.get_last_seq(user_id)))
    counts = {s: d.n for s, d in digests.items() if s != "last_seq"}
    counts["last_seq"] = ex.get_last_seq(user_id)
    return counts, {s: d.hexdigest() for s, d in digests.items()}


# -- the copy -------------------------------------------------------------------------------------
# Long: the copy in its order (users, exchanges, topics, vectors, text, log, meta) and the
# verification of each, in one place so nothing is copied unchecked.
def copy_store(
    src: Store,
    dst: Store,
    *,
    users: Sequence[str] | None = None,
    batch: int = 500,
    progress: ProgressFn | None = None,
) -> MigrationReport:
    """Copy every (or the listed) user's memory from ``src`` into ``dst`` and verify it.

    Refuses (``StateError``) to copy a user that already has exchanges or topics in ``dst``:
    a lossless copy needs an empty partition. Each batch is written in one ``dst`` transaction
    of that user. The returned report lists any mismatch; ``report.ok`` tells success.
    """
    started = time.monotonic()
    src_x, dst_x = exporter(src), exporter(dst)
    wanted = list(users) if users is not None else src.list_users()
    for user in wanted:
        if sum(dst.count_exchanges(user).values()) or dst.list_topics(user):
            raise StateError(f"the destination already holds data of user {user!r}; copy into an empty store")

    def tick(user: str, stage: str, done: int, total: int) -> None:
        if progress is not None:
            progress(f"{user}: {stage}", done, total)

    meta = [(k, v) for k, v in src_x.iter_meta() if k not in _LOCAL_META]
    for key, value in meta:
        dst.set_meta(key, value)

    reports: list[UserReport] = []
    mismatches: list[str] = []
    for user in wanted:
        total = sum(src.count_exchanges(user).values())
        done = 0
        pending: list[Exchange] = []
        for e in src.iter_exchanges(user, batch=batch):
            pending.append(e)
            if len(pending) >= batch:
                done += _write_exchanges(dst, user, pending)
                pending = []
                tick(user, "exchanges", done, total)
        done += _write_exchanges(dst, user, pending)
        tick(user, "exchanges", done, total)

        topics = src.list_topics(user)
        with dst.transaction(user):
            for t in topics:
                dst.put_topic(t)
        tick(user, "topics", len(topics), len(topics))

        for kind in _KINDS:
            ids = src_x.iter_vector_ids(user, kind)
            for n, chunk in enumerate(_chunks(ids, batch), start=1):
                vecs = src.get_vectors(user, kind, chunk)
                with dst.transaction(user):
                    dst.put_vectors(user, kind, list(chunk), np.stack([vecs[i] for i in chunk]))
                tick(user, f"{kind} vectors", min(n * batch, len(ids)), len(ids))
            texts = list(src_x.iter_text(user, kind))
            for start in range(0, len(texts), batch):
                with dst.transaction(user):
                    for item_id, body in texts[start : start + batch]:
                        dst.put_text(user, kind, item_id, body)
                tick(user, f"{kind} text", min(start + batch, len(texts)), len(texts))

        dfs = dict(src_x.iter_term_df(user))
        with dst.transaction(user):
            dst.add_term_counts(user, {t: df for t, df in dfs.items() if df > 0})
            zero = [t for t, df in dfs.items() if df <= 0]
            if zero:  # a term whose frequency fell back to zero is still a known term
                dst.add_term_df(user, zero, delta=1)
                dst.add_term_df(user, zero, delta=-1)
            for c in _all_changes(src, user):
                dst_x.put_change(c)
            dst_x.ensure_seq(user, src_x.get_last_seq(user))

        counts, sums = fingerprint(src, user, batch)
        dst_counts, dst_sums = fingerprint(dst, user, batch)
        bad = tuple(
            f"{user}: {s} differs (source {counts[s]} / {sums[s][:12]}, "
            f"destination {dst_counts[s]} / {dst_sums[s][:12]})"
            for s in SECTIONS
            if sums[s] != dst_sums[s] or counts[s] != dst_counts[s]
        )
        mismatches.extend(bad)
        reports.append(UserReport(user_id=user, counts=counts, checksums=sums, mismatches=bad))

    dst_meta = dict(exporter(dst).iter_meta())
    for key, value in meta:
        if dst_meta.get(key) != value:
            mismatches.append(f"meta {key!r} differs")
    return MigrationReport(
        source=_describe(src), destination=_describe(dst), users=tuple(reports),
        meta_keys=tuple(k for k, _ in meta), seconds=round(time.monotonic() - started, 3),
        mismatches=tuple(mismatches),
    )


def _write_exchanges(dst: Store, user: str, batch: list[Exchange]) -> int:
    if not batch:
        return 0
    with dst.transaction(user):
        for e in batch:
            dst.insert_exchange(e)
    return len(batch)


def _describe(store: Store) -> str:
    path = getattr(store, "path", None)
    if path is not None:
        return f"sqlite:{path}"
    return repr(store)
