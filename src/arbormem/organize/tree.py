"""Placing exchanges in the topic tree, without an LLM.

A user's tree: one root, themes (inner nodes) and topics (leaves holding runs of consecutive
exchanges). Each completed exchange is placed at once (TRACE's routing, decided here by
embedding similarity and time):

1. *Continue* the open topic when the exchange is similar enough to its centroid, in the same
   session, without a long pause, and the topic is not full.
2. Otherwise the open topic is *frozen* (the conversation moved away) and a new topic starts.
   Its parent is found by descending from the root into the most similar theme down to the
   bottom level (a CF-tree insertion, as in BIRCH); if the closest bottom theme is not
   similar enough, a new sibling theme starts a new branch next to it.
3. Fan-out stays bounded: an overfull node is split like a B-tree node (its children grouped
   by balanced spherical k-means on centroids, the overflow moving up), and only the root
   grows a level. All topics sit at the same depth, about log(topics), never a chain as deep
   as the conversation (TRACE's RecursionError).

Centroids are kept as vector sums, term counts as bounded counters, so an update touches only
the new leaf and its ancestors. ``TreeSession`` is a unit of work inside one store transaction:
it caches the nodes it reads and writes dirty ones (row, centroid, text index) once at the end.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections import Counter
from collections.abc import Mapping

import numpy as np

from ..config import TreeSettings
from ..models import Exchange
from ..store.base import Store, TopicRecord
from ..text import idf, merge_counts, prune_counts, sentences, shorten, terms, top_terms

# Bounded per-node term statistics: enough for keywords and titles, small enough to rewrite.
LEAF_TERMS = 96
THEME_TERMS = 128
KEYWORDS = 8


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _cos(a: np.ndarray | None, b: np.ndarray) -> float:
    if a is None:
        return -1.0
    return float(a @ b)


class TreeSession:
    """Unit of work over one user's tree; call inside ``store.transaction(user_id)``."""

    def __init__(self, store: Store, user_id: str, settings: TreeSettings) -> None:
        self.store = store
        self.user_id = user_id
        self.s = settings
        self._nodes: dict[str, TopicRecord] = {}
        self._kids: dict[str, list[str]] = {}
        self._dirty: set[str] = set()
        self._deleted: set[str] = set()
        self._to_summarise: set[str] = set()
        self.root = self._load_root()

    # -- node cache ------------------------------------------------------------------------------
    def _load_root(self) -> TopicRecord:
        roots = self.store.list_topics(self.user_id, parent_id=None)
        if roots:
            root = roots[0]
        else:
            root = TopicRecord(id=new_id("r"), user_id=self.user_id, kind="root", parent_id=None,
                               title="", created_seq=0)
            self._dirty.add(root.id)
            self._kids[root.id] = []
        self._nodes[root.id] = root
        return root

    def get(self, topic_id: str) -> TopicRecord | None:
        node = self._nodes.get(topic_id)
        if node is None and topic_id not in self._deleted:
            node = self.store.get_topic(topic_id)
            if node is not None and node.user_id == self.user_id:
                self._nodes[topic_id] = node
            else:
                node = None
        return node

    def children(self, node: TopicRecord) -> list[TopicRecord]:
        ids = self._kids.get(node.id)
        if ids is None:
            recs = self.store.list_topics(self.user_id, parent_id=node.id)
            for r in recs:
                self._nodes.setdefault(r.id, r)
            ids = [r.id for r in recs]
            self._kids[node.id] = ids
        return [self._nodes[i] for i in ids]

    def ancestors(self, node: TopicRecord) -> list[TopicRecord]:
        """Parents of ``node`` up to and including the root, nearest first."""
        out = []
        cur = node
        while cur.parent_id is not None:
            parent = self.get(cur.parent_id)
            if parent is None:
                break
            out.append(parent)
            cur = parent
        return out

    def _create(self, kind: str, parent: TopicRecord, seq: int) -> TopicRecord:
        rec = TopicRecord(id=new_id("t"), user_id=self.user_id, kind=kind,  # type: ignore[arg-type]
                          parent_id=parent.id, created_seq=seq)
        self._nodes[rec.id] = rec
        self._kids[rec.id] = []
        self.children(parent)
        self._kids[parent.id].append(rec.id)
        self._dirty.add(rec.id)
        self._dirty.add(parent.id)
        return rec

    def _reparent(self, node: TopicRecord, new_parent: TopicRecord) -> None:
        old = self.get(node.parent_id) if node.parent_id else None
        if old is not None:
            self.children(old)
            self._kids[old.id].remove(node.id)
            self._dirty.add(old.id)
        self.children(new_parent)
        self._kids[new_parent.id].append(node.id)
        node.parent_id = new_parent.id
        self._dirty.add(node.id)

    # -- placement -------------------------------------------------------------------------------
    def current(self) -> TopicRecord | None:
        cur_id = self.root.meta.get("current")
        return self.get(cur_id) if cur_id else None

    def place(self, ex: Exchange, vec: np.ndarray, counts: Mapping[str, int]) -> str:
        """Choose the topic for a completed exchange, update the tree, return the topic id."""
        cur = self.current()
        decision = "continue"
        if cur is None or not self._continues(cur, ex, vec):
            if cur is not None:
                self.freeze(cur)
            parent = self._descend(vec, ex.seq)
            cur = self._create("topic", parent, ex.seq)
            cur.meta["session"] = ex.session_id
            self.root.meta["current"] = cur.id
            self._dirty.add(self.root.id)
            decision = "new"
        self._add_to(cur, ex, vec, counts)
        if decision == "new":
            # A new leaf (and maybe a new theme) was added: bound the fan-out of every level
            # that gained a child, bottom-up.
            for node in self.ancestors(cur):
                self._bound_fanout(node, ex.seq)
        return cur.id

    def _continues(self, cur: TopicRecord, ex: Exchange, vec: np.ndarray) -> bool:
        if cur.frozen or cur.kind != "topic":
            return False
        if cur.size >= self.s.max_topic_size:
            return False
        if (cur.meta.get("session") or None) != (ex.session_id or None):
            return False
        if cur.last_at is not None:
            gap = (ex.user_at - cur.last_at).total_seconds() / 3600.0
            if gap > self.s.session_gap_hours:
                return False
        return _cos(cur.centroid(), vec) >= self.s.continue_threshold

    def _descend(self, vec: np.ndarray, seq: int) -> TopicRecord:
        """The bottom theme (a theme whose children are topics) for a new topic.

        Like an insertion into a B-tree / BIRCH CF-tree, the descent always reaches the bottom
        level, so every topic sits at the same depth and height grows only when the root
        splits. At the bottom, a theme that is not similar enough gets a new sibling theme
        instead (a new branch next to the closest one).
        """
        node = self.root
        while True:
            kids = [c for c in self.children(node) if c.kind == "theme"]
            if not kids:
                # Empty tree (or an empty inner node): start the first theme here.
                return self._create("theme", node, seq)
            best_sim, best = max(((_cos(t.centroid(), vec), t) for t in kids), key=lambda p: p[0])
            if any(c.kind == "theme" for c in self.children(best)):
                node = best
                continue
            if best_sim >= self.s.branch_threshold:
                return best
            return self._create("theme", node, seq)

    def _add_to(self, leaf: TopicRecord, ex: Exchange, vec: np.ndarray, counts: Mapping[str, int]) -> None:
        for i, node in enumerate([leaf, *self.ancestors(leaf)]):
            node.vec_sum = vec.astype(np.float32).copy() if node.vec_sum is None else node.vec_sum + vec
            node.size += 1
            node.start_seq = ex.seq if node.start_seq is None else min(node.start_seq, ex.seq)
            node.end_seq = ex.seq if node.end_seq is None else max(node.end_seq, ex.seq)
            node.first_at = ex.user_at if node.first_at is None else min(node.first_at, ex.user_at)
            node.last_at = ex.user_at if node.last_at is None else max(node.last_at, ex.user_at)
            if node.kind != "root":
                keep = LEAF_TERMS if i == 0 else THEME_TERMS
                node.terms = prune_counts(merge_counts(node.terms, counts.items()), keep)
            if i == 0 and not node.summary:
                node.summary = shorten(ex.user_text, 200)
            self._dirty.add(node.id)

    def remove(self, ex: Exchange, vec: np.ndarray | None, counts: Mapping[str, int]) -> None:
        """Take a deleted exchange out of its topic and the topic's ancestors."""
        if ex.topic_id is None:
            return
        leaf = self.get(ex.topic_id)
        if leaf is None:
            return
        if leaf.meta.get("aliases"):
            # A merged topic's part centroids (consolidate.py aliases) include this exchange.
            from .consolidate import drop_aliases

            drop_aliases(self.store, leaf)
        chain = [leaf, *self.ancestors(leaf)]
        for node in chain:
            if vec is not None and node.vec_sum is not None:
                node.vec_sum = node.vec_sum - vec
            node.size = max(0, node.size - 1)
            if node.kind != "root":
                node.terms = {t: c - counts.get(t, 0) for t, c in node.terms.items() if c - counts.get(t, 0) > 0}
            self._dirty.add(node.id)
        self._recompute_span(leaf)
        # Drop nodes that became empty, bottom-up (the root stays).
        for node in chain:
            if node.kind == "root" or node.size > 0:
                continue
            parent = self.get(node.parent_id) if node.parent_id else None
            if parent is not None:
                self.children(parent)
                if node.id in self._kids[parent.id]:
                    self._kids[parent.id].remove(node.id)
            if self.root.meta.get("current") == node.id:
                self.root.meta.pop("current", None)
                self._dirty.add(self.root.id)
            self._deleted.add(node.id)
            self._dirty.discard(node.id)
            self._nodes.pop(node.id, None)

    def move(self, ex: Exchange, vec: np.ndarray | None, counts: Mapping[str, int], target: TopicRecord) -> None:
        """Move a completed exchange to another leaf (re-segmentation), keeping every
        aggregate on both paths right; an emptied leaf is removed."""
        if vec is None or ex.topic_id == target.id:
            return
        moved = dataclasses.replace(ex, topic_id=target.id)
        self.store.update_exchange(moved)
        self._add_to(target, moved, vec, counts)
        self.remove(ex, vec, counts)

    def new_leaf_beside(self, topic_id: str | None, seq: int, under: str | None = None) -> TopicRecord:
        """A new leaf under theme ``under`` when that is a bottom-level theme of this user, else
        under the same theme as ``topic_id`` (fan-out kept bounded)."""
        parent = self.get(under) if under else None
        if parent is not None and (parent.kind != "theme"
                                   or any(c.kind != "topic" for c in self.children(parent))):
            parent = None  # only bottom-level themes keep every topic at the same depth
        near = self.get(topic_id) if topic_id else None
        if parent is None:
            parent = self.get(near.parent_id) if near is not None and near.parent_id else None
        if parent is None:
            parent = self._create("theme", self.root, seq)
        leaf = self._create("topic", parent, seq)
        for node in self.ancestors(leaf):
            self._bound_fanout(node, seq)
        return leaf

    def touch(self, node: TopicRecord) -> None:
        """Mark a node for writing at ``flush``."""
        self._dirty.add(node.id)

    def _recompute_span(self, leaf: TopicRecord) -> None:
        members = [e for e in self.store.list_exchanges(self.user_id, topic_id=leaf.id) if e.status == "completed"]
        if members:
            leaf.start_seq, leaf.end_seq = members[0].seq, members[-1].seq
            leaf.first_at = min(e.user_at for e in members)
            leaf.last_at = max(e.user_at for e in members)

    # -- fan-out -----------------------------------------------------------------------------------
    def _bound_fanout(self, node: TopicRecord, seq: int) -> None:
        """Split an overfull node like a B-tree node.

        An inner node's children are grouped (balanced spherical k-means on centroids) and all
        groups but the first move to new sibling themes under the same parent, so the overflow
        moves up; only the root grows a level (its groups become new themes below it). Every
        leaf therefore stays at about log_{max_children/2}(topics) depth, however unevenly
        the conversation visits its subjects.
        """
        kids = self.children(node)
        if len(kids) <= self.s.max_children:
            return
        cap = max(2, self.s.max_children // 2)
        k = max(2, math.ceil(len(kids) / cap))
        dim = next(c.vec_sum.shape[0] for c in kids if c.vec_sum is not None)
        zero = np.zeros(dim, dtype=np.float32)
        vecs = np.stack([_or(c.centroid(), zero) for c in kids])
        groups = [g for g in balanced_groups(vecs, k, cap) if g]
        if node.kind == "root":
            # Every group moves down a level, singletons too: a child left at the root would
            # put its topics one level shallower than all the others.
            targets = [self._create("theme", node, seq) for _ in groups]
            movers = groups
        else:
            parent = self.get(node.parent_id) if node.parent_id else None
            if parent is None:
                return
            movers = groups[1:]
            targets = [self._create("theme", parent, seq) for _ in movers]
        for theme, group in zip(targets, movers, strict=True):
            for j in group:
                self._reparent(kids[j], theme)
            self._recompute(theme)
            self.store.log_change(self.user_id, "split", theme.id, {
                "from": node.id, "children": [kids[j].id for j in group], "reason": "fan-out",
                "max_children": self.s.max_children,
            })
        if node.kind != "root":
            self._recompute(node)

    def _recompute(self, node: TopicRecord) -> None:
        """Rebuild an inner node's aggregates from its children."""
        kids = self.children(node)
        sums = [c.vec_sum for c in kids if c.vec_sum is not None]
        node.vec_sum = np.sum(sums, axis=0).astype(np.float32) if sums else None
        node.size = sum(c.size for c in kids)
        terms_acc: dict[str, int] = {}
        for c in kids:
            terms_acc = merge_counts(terms_acc, c.terms.items())
        node.terms = prune_counts(terms_acc, THEME_TERMS)
        for attr, pick in (("start_seq", min), ("end_seq", max), ("first_at", min), ("last_at", max)):
            values = [getattr(c, attr) for c in kids if getattr(c, attr) is not None]
            setattr(node, attr, pick(values) if values else None)
        node.frozen = all(c.frozen for c in kids) if kids else node.frozen
        self._dirty.add(node.id)

    # -- labels --------------------------------------------------------------------------------------
    def freeze(self, leaf: TopicRecord) -> None:
        leaf.frozen = True
        self._dirty.add(leaf.id)
        self._to_summarise.add(leaf.id)

    def set_label(self, topic_id: str, *, expect_size: int, expect_end: int | None, title: str,
                  keywords: list[str], summary: str, meta: Mapping[str, object]) -> bool:
        """Store labels validated by the organiser's LLM (``organize/enrich.py``).

        Refused (False) when the topic changed since the labels were asked for. ``flush``
        keeps them while the topic keeps that size; the parent is refreshed because a
        theme's summary lists its children's titles.
        """
        node = self.get(topic_id)
        if node is None or node.kind != "topic" or node.size != expect_size or node.end_seq != expect_end:
            return False
        node.title, node.keywords, node.summary = title, list(keywords), summary
        node.meta.update(meta)
        node.meta["label_size"] = node.size
        self._dirty.add(node.id)
        if node.parent_id and self.get(node.parent_id) is not None:
            self._dirty.add(node.parent_id)
        return True

    def flush(self) -> list[str]:
        """Write every changed node (row, centroid, text index); return their ids."""
        # Deepest first: a theme's summary and frozen flag are computed from its children,
        # which must be final by then (set order would make the stored tree vary run to run).
        dirty = sorted((self._nodes[i] for i in self._dirty if i in self._nodes),
                       key=lambda n: (-len(self.ancestors(n)), n.created_seq, n.id))
        n_docs = max(1, self.root.size)
        wanted = {t for node in dirty for t in node.terms}
        df = self.store.get_term_df(self.user_id, list(wanted)) if wanted else {}
        for node in dirty:
            if node.kind == "root" or _llm_labelled(node):
                continue
            node.keywords = top_terms(node.terms, df, n_docs, KEYWORDS)
            node.title = make_title(node.keywords)
            if node.id in self._to_summarise and node.kind == "topic":
                node.summary = self._extractive_summary(node, df, n_docs)
            elif node.kind == "theme":
                kids = sorted(self.children(node), key=lambda k: (k.start_seq or 0, k.created_seq, k.title))
                node.summary = shorten("; ".join(k.title for k in kids if k.title), 240)
                node.frozen = all(k.frozen for k in kids) if kids else node.frozen
        for node in dirty:
            self.store.put_topic(node)
        vec_nodes = [n for n in dirty if n.kind != "root" and n.centroid() is not None]
        if vec_nodes:
            self.store.put_vectors(self.user_id, "topic", [n.id for n in vec_nodes],
                                   np.stack([n.centroid() for n in vec_nodes]))  # type: ignore[misc]
        for node in dirty:
            if node.kind != "root":
                self.store.put_text(self.user_id, "topic", node.id, topic_index_text(node))
        for topic_id in self._deleted:
            self.store.delete_topic(topic_id)
        ids = [n.id for n in dirty]
        self._dirty.clear()
        self._deleted.clear()
        self._to_summarise.clear()
        return ids

    def _extractive_summary(self, leaf: TopicRecord, df: Mapping[str, int], n_docs: int) -> str:
        members = self.store.list_exchanges(self.user_id, topic_id=leaf.id)
        weights = {t: idf(df.get(t, 1), n_docs) for t in leaf.keywords}
        best: list[tuple[float, int, str]] = []
        order = 0
        for ex in members:
            for sent in sentences(ex.user_text) + sentences(ex.assistant_text):
                toks = set(terms(sent))
                score = sum(w for t, w in weights.items() if t in toks) / (1.0 + 0.02 * len(sent))
                best.append((score, order, sent))
                order += 1
        top = sorted(best, key=lambda b: -b[0])[:2]
        text = " ".join(s for _, _, s in sorted(top, key=lambda b: b[1]))
        return shorten(text, 240) if text else leaf.summary


def _or(vec: np.ndarray | None, default: np.ndarray) -> np.ndarray:
    return default if vec is None else vec


def make_title(keywords: list[str]) -> str:
    """A short offline title: the top keywords, capitalised."""
    return " · ".join(k[:1].upper() + k[1:] for k in keywords[:3]) or "Untitled"


def _llm_labelled(node: TopicRecord) -> bool:
    # LLM labels stay until the topic changes size (then offline labels return and the
    # organiser labels it again).
    return node.meta.get("label_source") == "llm" and node.meta.get("label_size") == node.size


def topic_index_text(node: TopicRecord) -> str:
    """What the lexical topic index sees: title, keywords and summary (and, for LLM-labelled
    topics, the retrieval terms and trigger)."""
    extra = " ".join(str(t) for t in node.meta.get("retrieval_terms") or ())
    trigger = str(node.meta.get("trigger") or "")
    tail = f"\n{extra}\n{trigger}" if _llm_labelled(node) and (extra or trigger) else ""
    # A merged topic is also found by its parts' pre-merge labels (consolidate.py aliases).
    parts = "".join(f"\n{t}" for t in (node.meta.get("part_text") or {}).values())
    return f"{label_text(node)}{tail}{parts}"


def label_text(node: TopicRecord) -> str:
    """A topic's labels as indexed text: title, keywords, summary (one line each)."""
    return f"{node.title}\n{' '.join(node.keywords)}\n{node.summary}"


def balanced_groups(vecs: np.ndarray, k: int, cap: int, iters: int = 6) -> list[list[int]]:
    """Group rows of ``vecs`` into ``k`` groups of at most ``cap`` by spherical k-means.

    Deterministic (farthest-point initialisation); capacity is enforced by assigning the most
    confident items first and spilling the rest to their next-best group with room.
    """
    n = len(vecs)
    k = min(k, n)
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    unit = vecs / np.where(norms == 0, 1, norms)
    centers = [0]
    while len(centers) < k:
        sims = np.max(unit @ unit[centers].T, axis=1)
        sims[centers] = np.inf
        centers.append(int(np.argmin(sims)))
    c = unit[centers].copy()
    assign = np.zeros(n, dtype=int)
    for _ in range(iters):
        sims = unit @ c.T
        order = np.argsort(-sims.max(axis=1))
        load = Counter[int]()
        for i in order:
            for g in np.argsort(-sims[i]):
                if load[int(g)] < cap:
                    assign[i] = int(g)
                    load[int(g)] += 1
                    break
        for g in range(k):
            members = unit[assign == g]
            if len(members):
                m = members.sum(axis=0)
                c[g] = m / (np.linalg.norm(m) or 1.0)
    return [[i for i in range(n) if assign[i] == g] for g in range(k)]

