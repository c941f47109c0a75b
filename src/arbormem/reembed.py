"""Re-embedding: moving a memory to another embedder (``Memory.reembed``, ``arbormem reembed``).

Vectors of two models must never share an index. Open the memory with the new embedder; for
each user, in one store transaction, the exchanges that have a vector (completed ones) are
embedded again in batches, each batch checked before it is written, and every topic's vector
sum is rebuilt from its members as the tree keeps it. Progress is recorded in the store meta
key ``REEMBED_KEY`` (``{"target": "NAME:DIM", "done": [users]}``, "" once finished), so an
interrupted run resumes with the next user; meanwhile ``Writer.check_embedder`` refuses both
models (docs/architecture.md, "Re-embedding").
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import numpy as np

from . import validate as v
from .embed import check_vectors
from .ingest import REEMBED_KEY, Writer, reembed_state
from .models import Exchange, ReembedProgress, ReembedReport
from .organize.aliases import drop_aliases
from .organize.tree import topic_index_text
from .store.base import TopicRecord


def reembed(
    writer: Writer, *, user_id: str | None = None, batch_size: int = 256,
    progress: Callable[[ReembedProgress], None] | None = None, force: bool = False,
) -> ReembedReport:
    """Rewrite every stored vector with the writer's embedder, one user per transaction,
    resumable; the behaviour and its guarantees are documented on ``Memory.reembed``."""
    v.integer(batch_size, "batch_size", 1)
    store = writer.store
    only = None if user_id is None else v.user_id(user_id)
    t0 = time.perf_counter()
    spec = writer.embedder.spec
    previous = store.get_meta("embedder")
    state = reembed_state(store.get_meta(REEMBED_KEY))
    if state is None and previous == spec and not force:
        return ReembedReport(embedder=spec, previous=previous, complete=True,
                             seconds=time.perf_counter() - t0)
    if state is None or state["target"] != spec:
        # Nothing under way, or an interrupted re-embed to another model (its done users
        # hold that model's vectors): every user is re-embedded for this one. The progress
        # key is written with the first user's vectors, so a failure before that leaves
        # the memory as it was.
        state = {"target": spec, "done": []}
    writer.recheck_embedder()  # this Memory must refuse reads until done, too
    users = [only] if only is not None else store.list_users()
    done: list[str] = []
    skipped: list[str] = []
    n_ex = n_topics = n_aliases = 0
    for uid in users:
        if uid in state["done"]:
            skipped.append(uid)
            continue
        ex_count, topic_count, alias_count = _reembed_user(writer, uid, spec, previous, batch_size, progress)
        done.append(uid)
        n_ex, n_topics, n_aliases = n_ex + ex_count, n_topics + topic_count, n_aliases + alias_count
    recorded = reembed_state(store.get_meta(REEMBED_KEY))
    finished = set(recorded["done"]) if recorded is not None and recorded["target"] == spec else set()
    pending = tuple(u for u in store.list_users() if u not in finished)
    if not pending:
        # One small transaction: a crash between the two leaves the progress key, and
        # the next call (every user done) just finishes the switch.
        with store.transaction("arbormem:reembed"):  # the name only serialises
            store.set_meta("embedder", spec)
            store.set_meta(REEMBED_KEY, "")
    return ReembedReport(
        embedder=spec, previous=previous, users=tuple(done), skipped=tuple(skipped),
        pending=pending, exchanges=n_ex, topics=n_topics, aliases_dropped=n_aliases,
        complete=not pending, seconds=time.perf_counter() - t0,
    )


# Long: one user in one transaction: exchange vectors, then topic sums deepest first, then
# the progress mark committed with them; a split would pass the transaction's state around.
def _reembed_user(writer: Writer, uid: str, spec: str, previous: str | None, batch_size: int,
                  progress: Callable[[ReembedProgress], None] | None) -> tuple[int, int, int]:
    """Re-embed one user in one transaction; returns (exchange vectors, topic vectors,
    aliases dropped). Embeds with the user's write lock held: the set of exchanges cannot
    change under it."""
    store, emb = writer.store, writer.embedder
    with store.transaction(uid):
        # Exactly the exchanges that have a vector today get a new one (completed ones;
        # pending and failed exchanges have none).
        wanted: set[str] = set()
        chunk: list[str] = []
        for ex in store.iter_exchanges(uid):
            chunk.append(ex.id)
            if len(chunk) == 1000:
                wanted.update(store.get_vectors(uid, "exchange", chunk))
                chunk = []
        wanted.update(store.get_vectors(uid, "exchange", chunk) if chunk else ())
        total = len(wanted)
        sums: dict[str, np.ndarray] = {}  # leaf id -> sum of its members' new unit vectors
        batch: list[Exchange] = []
        written = 0

        def write(batch: list[Exchange]) -> int:
            raw = emb.embed([e.text for e in batch])
            # embed() validates already; checked again because a subclass may override it,
            # and nothing unchecked may reach the store
            mat = check_vectors(raw, len(batch), emb.dim, emb.name)
            store.put_vectors(uid, "exchange", [e.id for e in batch], mat)
            for e, vec in zip(batch, mat, strict=True):
                if e.topic_id is not None:
                    acc = sums.get(e.topic_id)
                    sums[e.topic_id] = vec.copy() if acc is None else acc + vec
            if progress is not None:
                progress(ReembedProgress(user_id=uid, done=written + len(batch), total=total))
            return len(batch)

        for ex in store.iter_exchanges(uid):
            if ex.id in wanted:
                batch.append(ex)
                if len(batch) == batch_size:
                    written += write(batch)
                    batch = []
        if batch:
            written += write(batch)

        # Topic sums as the tree keeps them (organize/tree.py): a leaf sums its exchanges'
        # unit vectors, an inner node (and the root) its children's sums. Deepest first.
        topics = {t.id: t for t in store.list_topics(uid)}
        had = set(store.get_vectors(uid, "topic", list(topics)))
        kids: dict[str, list[TopicRecord]] = {}
        for t in topics.values():
            if t.parent_id is not None:
                kids.setdefault(t.parent_id, []).append(t)

        def depth(t: TopicRecord) -> int:
            d, cur, seen = 0, t, {t.id}
            while cur.parent_id in topics and cur.parent_id not in seen:
                cur = topics[cur.parent_id]
                seen.add(cur.id)
                d += 1
            return d

        aliases = 0
        for t in sorted(topics.values(), key=lambda t: -depth(t)):
            if t.kind == "topic":
                t.vec_sum = sums.get(t.id)
            else:
                parts = [c.vec_sum for c in kids.get(t.id, []) if c.vec_sum is not None]
                t.vec_sum = np.sum(parts, axis=0).astype(np.float32) if parts else None
            if t.meta.aliases:
                aliases += len(t.meta.aliases)
                drop_aliases(store, t)  # also drops the parts' text: reindex below
                store.put_text(uid, "topic", t.id, topic_index_text(t))
            store.put_topic(t)
        vec_nodes = [t for t in topics.values() if t.kind != "root" and t.centroid() is not None]
        for start in range(0, len(vec_nodes), 1000):
            part = vec_nodes[start : start + 1000]
            store.put_vectors(uid, "topic", [t.id for t in part],
                              np.stack([t.centroid() for t in part]))  # type: ignore[misc]
        for t in topics.values():
            if t.id in had and t.centroid() is None:
                # no member vector left to rebuild it from: no old-model vector may stay
                store.delete_index("topic", t.id)
                store.put_text(uid, "topic", t.id, topic_index_text(t))
        store.log_change(uid, "reembed", uid, {
            "embedder": spec, "previous": previous, "exchanges": written,
            "topics": len(vec_nodes), "aliases_dropped": aliases,
        })
        # Committed with the vectors: the next call skips this user.
        state = reembed_state(store.get_meta(REEMBED_KEY))
        done = state["done"] if state is not None and state["target"] == spec else []
        store.set_meta(REEMBED_KEY, json.dumps({"target": spec, "done": sorted({*done, uid})}))
    return written, len(vec_nodes), aliases


__all__ = ["REEMBED_KEY", "reembed", "reembed_state"]
