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
import functools
import math
import re
import uuid
from collections.abc import Iterable, Mapping

import numpy as np

from ..config import TreeSettings
from ..models import Exchange
from ..store.base import Store, TopicRecord, TopicShape
from ..text import (
    idf,
    merge_counts,
    number_only,
    prune_counts,
    sentences,
    shorten,
    stem,
    term_counts,
    terms,
    top_terms,
)
from . import labels
from .aliases import drop_aliases
from .heuristics import is_pleasantry, shared_words
from .index_text import llm_labelled, topic_index_text
from .shift import ShiftHead
from .title_vectors import PhraseVectors

# Bounded per-node term statistics: enough for keywords and titles, small enough to rewrite.
LEAF_TERMS = 96
THEME_TERMS = 128
KEYWORDS = 8


#: How much better a topic's best other branch must link than its own before the
#: misplaced-topics step moves it (``TreeSession.rehome_topics``), and how far below the short
#: returns' threshold its own link must be before it goes to the top level alone. Without it,
#: topics of one subject split over two branches hopped between them on every consolidation
#: run (17 and 9 moves in the second and third runs over the subject histories; 0 and 0 with
#: it; docs/tree.md, "Misplaced topics").
_REHOME_MARGIN = 0.02


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class TreeSession:
    """Unit of work over one user's tree; call inside ``store.transaction(user_id)``."""

    def __init__(self, store: Store, user_id: str, settings: TreeSettings, shift: ShiftHead | None = None,
                 phrases: PhraseVectors | None = None) -> None:
        self.store = store
        self.user_id = user_id
        self.s = settings
        # The embedder's view of candidate titles (organize/title_vectors.py; the writer
        # passes it): with it a theme wears the candidate nearest its centroid.
        self.phrases = phrases
        # The embedder's topic-shift head (organize/shift.py; the writer passes it when
        # ``shift_head`` is on): with it, placement asks the head rather than the link rule
        # whether an exchange opens a topic (``_opens``). Lookahead judges pairs by the link.
        self.shift = None if settings.lookahead else shift
        self._nodes: dict[str, TopicRecord] = {}
        # The topics among ``_nodes``, in the same order (homing scans the held leaves for
        # every exchange; a unit of work holds several times as many themes and topics).
        self._leaves: dict[str, TopicRecord] = {}
        self._shape_cache: dict[str, TopicShape] = {}  # nodes as stored, for homing
        self._stored_text: dict[str, str] = {}  # full-text entries as stored (_loaded)
        self._stored_vec: dict[str, np.ndarray | None] = {}  # centroids as stored
        self._kids: dict[str, list[str]] = {}
        self._dirty: set[str] = set()
        self._deleted: set[str] = set()
        self._to_summarise: set[str] = set()
        self._vecs: dict[str, np.ndarray] = {}
        self._judged: float | None = None  # the shift head's probability for the exchange being placed
        self._phrases: dict[tuple[str, str], dict[str, int]] = {}  # _phrases_of
        # Creation order of the nodes made by this unit of work: new rows are written in it
        # (ids are random, so ordering by id would give identical builds different shapes).
        self._born: dict[str, int] = {}
        # Each loaded node's child ids as stored: a node whose list still matches cannot have
        # become a single-child chain, and its title's child count is the stored one (flush
        # then reads no child rows for the ancestors an exchange only passed through).
        self._kids_stored: dict[str, tuple[str, ...]] = {}
        # Themes whose summary must be rebuilt at flush (a child's title or state changed).
        self._stale_summary: set[str] = set()
        # Exchanges placed earlier whose topic this unit of work changed (segmentation lag).
        self.moved: dict[str, str] = {}
        self.root = self._load_root()

    # -- node cache ------------------------------------------------------------------------------
    def _load_root(self) -> TopicRecord:
        roots = self.store.list_topics(self.user_id, parent_id=None)
        if roots:
            root = roots[0]
            self._loaded(root)
        else:
            root = TopicRecord(id=new_id("r"), user_id=self.user_id, kind="root", parent_id=None,
                               title="", created_seq=0)
            self._dirty.add(root.id)
            self._kids[root.id] = []
        self._hold(root)
        return root

    def _loaded(self, node: TopicRecord) -> None:
        """Remember what the store holds of a node read from it, so ``flush`` rewrites its
        full-text entry and centroid only when they changed (re-indexing the text of every
        ancestor on every exchange was a third of the statements an exchange cost)."""
        self._stored_text[node.id] = topic_index_text(node)
        self._stored_vec[node.id] = node.centroid()

    def _hold(self, node: TopicRecord) -> None:
        self._nodes[node.id] = node
        if node.kind == "topic":
            self._leaves[node.id] = node

    def get(self, topic_id: str) -> TopicRecord | None:
        node = self._nodes.get(topic_id)
        if node is None and topic_id not in self._deleted:
            node = self.store.get_topic(topic_id)
            if node is not None and node.user_id == self.user_id:
                self._hold(node)
                self._loaded(node)
            else:
                node = None
        return node

    def children(self, node: TopicRecord) -> list[TopicRecord]:
        ids = self._kids.get(node.id)
        if ids is None:
            recs = self.store.list_topics(self.user_id, parent_id=node.id)
            for r in recs:
                if r.id not in self._nodes:
                    self._hold(r)
                    self._loaded(r)
            ids = [r.id for r in recs]
            self._kids[node.id] = ids
            self._kids_stored[node.id] = tuple(ids)
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
        self._hold(rec)
        self._kids[rec.id] = []
        self._born[rec.id] = len(self._born)
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
        cur_id = self.root.meta.current
        return self.get(cur_id) if cur_id else None

    def place(self, ex: Exchange, vec: np.ndarray, counts: Mapping[str, int]) -> str:
        """Choose the topic for a completed exchange, update the tree, return the topic id.

        Segmentation (docs/tree.md): an exchange continues the open topic while its average
        link (mean cosine) to the topic's exchanges stays at or above ``continue_threshold``.
        With ``lookahead`` on, the decision waits one exchange: the newest exchange is
        *pending* and is judged together with the next one, so a one-exchange digression
        stays in its topic. A closing exchange ("thanks, that's all") stays in its topic and
        closes it: what comes next starts a new topic unless it is clearly the same thread.
        A new session or a long pause closes the topic too.
        """
        vec = vec.astype(np.float32)
        self._vecs[ex.id] = vec
        closing = is_closing(ex.user_text)
        cur = self.current()
        if cur is not None and (cur.kind != "topic" or cur.frozen):
            cur = None
        if cur is not None and self._hard_break(cur, ex):
            self._settle(cur, None)
            self.close(cur)
            cur = None
        # The shift head's judgements of this session so far go with the open topic (a new
        # session starts none): ``_opens`` reads a spike against their median.
        usual = list(cur.meta.shift_p) if cur is not None else []
        self._judged = None
        if cur is not None and closing:
            self._settle(cur, None)  # the pending exchange is judged on its own
            target = cur
        elif cur is not None and cur.meta.closing:
            cur.meta.closing = False
            self._dirty.add(cur.id)
            if self._link(vec, 1, cur) >= self.s.thread_threshold:
                target = cur
            else:
                self.close(cur)
                target = None
        elif cur is not None and self.s.lookahead:
            target = self._settle(cur, (ex, vec)) or cur
        elif cur is not None and self._opens(cur, ex, vec) and not is_pleasantry(ex.user_text):
            # (Judged all the same: the head's judgement joins the session's usual.)
            self.close(cur)
            target = None
        else:
            target = cur
        if target is None:
            target = self._home(vec, 1, ex.seq, ex.session_id)
        self._add_to(target, ex, vec, counts)
        target.meta.session = ex.session_id
        if self._judged is not None:
            usual = [*usual, round(self._judged, 3)][-_SHIFT_HISTORY:]
        target.meta.shift_p = usual
        if closing:
            target.meta.closing = True
            target.meta.pending = None
        elif self.s.lookahead:
            target.meta.pending = ex.id
        if self.root.meta.current != target.id:
            self.root.meta.current = target.id
            self._dirty.add(self.root.id)
        self._dirty.add(target.id)
        return target.id

    def _opens(self, cur: TopicRecord, ex: Exchange, vec: np.ndarray) -> bool:
        """Does ``ex`` leave the open topic ``cur`` (same session, no long pause)? Yes when the
        user says so ("different topic: ...", "back to the wedding"); else the shift head
        decides when there is one and ``ex`` follows an exchange of its session; else the
        average link to the topic against ``_continue_at``."""
        if announces_shift(ex.user_text):
            return True
        if self.shift is not None:
            prev = {e.seq: e for e in self.store.exchanges_by_seq(self.user_id, [ex.seq - 2, ex.seq - 1])
                    if (e.session_id or None) == (ex.session_id or None)}
            p1, p2 = prev.get(ex.seq - 1), prev.get(ex.seq - 2)
            v1 = self._vec(p1.id) if p1 is not None else None
            if p1 is not None and v1 is not None:
                v2 = self._vec(p2.id) if p2 is not None else None
                p = self.shift.probability(vec, v1, v2, ex.user_text, p1.assistant_text)
                if p is not None:
                    self._judged = p
                    usual = cur.meta.shift_p
                    # A full message that links weakly to the open topic leaves it whatever
                    # the head says: the head learnt chit-chat's shifts, and on subject
                    # histories written by another hand it let "He wants to book his theory
                    # test" continue a talk about a neighbour's hedge (docs/tree.md, "Spikes
                    # and full messages").
                    link = self._link(vec, 1, cur)
                    full = bool(self.s.link_words) and _user_words(ex) >= self.s.link_words \
                        and link < self.s.link_floor
                    # A message of any length that shares nothing with the topic (link under
                    # 0.10, no word picked up from the last reply) leaves it when the head gives it
                    # a fair chance: on subject histories most missed switches were short
                    # ("Do we have to tell the neighbours?" after hot-sauce labels, p 0.38),
                    # and a word of the last reply marks a follow-up ("Sorry, what does
                    # flashing mean?"; docs/tree.md, "Unlinked switches").
                    unlinked = link < self.s.unlinked_floor and p >= self.s.unlinked_p
                    # Both link rules were made for a user talking with an assistant whose
                    # replies carry the subject; where the replies are a line each (chit-chat
                    # between people, LoCoMo, a terse system) the topic's vectors are thin and
                    # a low link is routine: on TIAGE the two rules opened 42 topics, 6 at a
                    # boundary (docs/tree.md, "Terse conversations"). Judged only when a rule
                    # would fire: most exchanges link above both floors.
                    in_branch = False  # the nearest other topic is known to share cur's branch
                    # A short question about what was just said ("Does it have parking?", "Is it
                    # free?", "Do they have vegetarian options?") names nothing of its own: a thin
                    # vector the head often rates as new, and a low link. Only the head's own
                    # threshold opens a topic there (docs/tree.md, "Short questions that refer back").
                    back = _refers_back(ex.user_text, self.s.back_words)
                    if back:
                        unlinked = False
                    if (full or unlinked) and not _terse(self.s.terse_replies, ex, p1, p2):
                        if full:
                            in_branch = self._nearest_in_branch(cur, vec)
                            if not in_branch:
                                return True
                        if unlinked and not _picks_up(ex.user_text, p1):
                            return True
                    # A spike above the session's usual judgements: the head ranks openings
                    # above continuations in any style it was tested on, but its calibration
                    # varies with the style (on blind in-car and booking dialogues it gave 0.5
                    # at shifts and ~0.1 between them; docs/tree.md, "Spikes and full
                    # messages").
                    if p > self.s.shift_threshold or (
                            not back and self.s.shift_spike > 0 and p > self.s.shift_spike_at and bool(usual)
                            and p > self.s.shift_spike * float(np.median(usual))):
                        return True
                    if _asks_anew(self.s, p, ex.user_text):
                        return True
                    # A return to another subject mid-session ("Mochi got her rabies shot
                    # today" during visa questions) links to the open topic like a related
                    # follow-up but clearly better to that subject's earlier topic
                    # (docs/tree.md, "Returns mid-session"). Judged only where the head gives
                    # it a fair chance: most exchanges cost no vector search; none runs twice
                    # (a nearest topic in cur's own branch is no return).
                    return p >= self.s.return_p and not in_branch and self._returns_elsewhere(cur, ex, vec, link)
        return self._link(vec, 1, cur) < self._continue_at(ex)

    def _returns_elsewhere(self, cur: TopicRecord, ex: Exchange, vec: np.ndarray, link: float) -> bool:
        """Is ``ex`` a return to a subject of an earlier session? Yes when the topic it links
        to best, the open one aside, was last placed in another session, lies in another
        top-level branch, and its link passes both the theme threshold (``_theme_at``: judged
        against the user's background, so in a memory where everything is alike, LoCoMo's
        small talk, it does not fire) and the link to the open topic by ``return_margin``."""
        if self.s.return_margin <= 0:
            return False
        nearest = self._nearest_other(cur, vec)
        if nearest is None:
            return False
        best_link, best = nearest
        if best_link < max(self._theme_at(), link) + self.s.return_margin:
            return False
        node = self.get(best.id)
        if node is None or (node.meta.session or None) == (ex.session_id or None):
            return False
        return self._top_shape(best).id != self._top(cur).id

    def _nearest_in_branch(self, cur: TopicRecord, vec: np.ndarray) -> bool:
        """Is the topic ``vec`` links to best, the open one aside, in the open topic's own
        subject branch (a theme at the top level)? Then a full message that links weakly to
        the open topic is a follow-up within its subject ("should I put all 150k in at once?"
        after choosing an index fund, with the fund's earlier topic nearest), not a switch:
        leaving would only open another topic beside it under the same theme. On the subject
        histories this held for 5 of the 7 full-message openings it covers that split a visit
        (docs/tree.md, "Follow-ups within a branch")."""
        top = self._top(cur)
        if top.id == cur.id:
            return False
        nearest = self._nearest_other(cur, vec)
        return nearest is not None and self._top_shape(nearest[1]).id == top.id

    def _nearest_other(self, cur: TopicRecord, vec: np.ndarray) -> tuple[float, TopicShape] | None:
        """The topic ``vec`` links to best, the open topic ``cur`` aside, with that link (None
        when there is no other): one vector search over the topics."""
        scored = [(self._link(vec, 1, c), c.id, c) for c in self._candidates(vec, cur.id)]
        if not scored:
            return None
        link, _, best = max(scored, key=lambda x: (x[0], x[1]))
        return link, best

    def _continue_at(self, ex: Exchange) -> float:
        """The average link at which ``ex`` continues the open topic: lower for a short reply.
        On the development sets a single threshold traded task dialogues (short replies that
        must continue their booking: they want ~0.15) against subject histories (full
        messages that open a new subject at 0.15-0.22: they want ~0.22); by length, both
        improve (docs/tree.md)."""
        if _user_words(ex) <= self.s.reply_words:
            return self.s.reply_threshold
        return self.s.continue_threshold

    def _hard_break(self, cur: TopicRecord, ex: Exchange) -> bool:
        if cur.size >= self.s.max_topic_size:
            return True
        if (cur.meta.session or None) != (ex.session_id or None):
            return True
        if cur.last_at is not None:
            gap = (ex.user_at - cur.last_at).total_seconds() / 3600.0
            if gap > self.s.session_gap_hours:
                return True
        return False

    def _settle(self, cur: TopicRecord, nxt: tuple[Exchange, np.ndarray] | None) -> TopicRecord | None:
        """Decide the open topic's pending exchange (see ``place``). Returns the new topic the
        pending exchange moved to, or None when it stays."""
        pid = cur.meta.pending
        if not pid or cur.size < 2 or cur.vec_sum is None:
            return None
        pvec = self._vec(pid)
        if pvec is None:
            return None
        rest = cur.vec_sum - pvec
        pair = pvec if nxt is None else pvec + nxt[1]
        n_pair = 1 if nxt is None else 2
        link = float(rest @ pair) / ((cur.size - 1) * n_pair)
        cur.meta.pending = None
        self._dirty.add(cur.id)
        if link >= self.s.continue_threshold:
            return None
        pend = self.store.get_exchange(pid)
        if pend is None or pend.topic_id != cur.id:
            return None
        counts = term_counts(pend.text)
        # Detach first (the row too, so the old topic's span is recomputed without it).
        self.store.update_exchange(dataclasses.replace(pend, topic_id=None))
        self.remove(pend, pvec, counts)
        self.close(cur)
        leaf = self._home(pair, n_pair, pend.seq, pend.session_id)
        moved = dataclasses.replace(pend, topic_id=leaf.id)
        self.store.update_exchange(moved)
        self.moved[pend.id] = leaf.id
        self._add_to(leaf, moved, pvec, counts)
        return leaf

    def _vec(self, exchange_id: str) -> np.ndarray | None:
        v = self._vecs.get(exchange_id)
        if v is None:
            got = self.store.get_vectors(self.user_id, "exchange", [exchange_id])
            v = got.get(exchange_id)
        return v

    # -- homing ----------------------------------------------------------------------------------
    def _home(self, vsum: np.ndarray, n: int, seq: int, session: str | None) -> TopicRecord:
        """The leaf for a new run of ``n`` exchanges whose vectors sum to ``vsum``.

        Returns go home: an earlier topic of the same thread (average link >=
        ``thread_threshold``, room left) takes the run back; otherwise a new topic starts
        under the theme the run belongs to (average link to the theme's exchanges >=
        ``theme_threshold``), or beside a lone related topic (the two become a theme), or at
        the top level when nothing is related.
        """
        home = self._find_home(vsum, n, exclude=None)
        if home.thread is not None:
            home.thread.frozen = False
            self.touch(home.thread)
            return home.thread
        parent = home.theme if home.theme is not None else (
            self._pair_theme(home.pair) if home.pair is not None else self.root)
        leaf = self._create("topic", parent, seq)
        leaf.meta.session = session
        self.bound_fanout(parent, seq)
        return leaf

    def _link(self, vsum: np.ndarray, n: int, node: TopicRecord | TopicShape) -> float:
        """Average link: the mean cosine between the run's exchanges and the node's."""
        if node.vec_sum is None or node.size <= 0:
            return -1.0
        return float(vsum @ node.vec_sum) / (n * node.size)

    # Homing compares many nodes and changes none of them, so it reads their shapes
    # (Store.topic_shapes: no term counts or phrases to decode) and loads whole records only
    # for the node it picks. A node this session holds is authoritative: its shape is taken
    # from the live record, which may have changed since the last flush.
    def _shapes(self, ids: Iterable[str]) -> dict[str, TopicShape]:
        out: dict[str, TopicShape] = {}
        missing = []
        for i in dict.fromkeys(ids):
            if i in self._deleted:
                continue
            node = self._nodes.get(i)
            if node is not None:
                out[i] = node.shape()
            elif i in self._shape_cache:
                out[i] = self._shape_cache[i]
            else:
                missing.append(i)
        if missing:
            got = self.store.topic_shapes(self.user_id, ids=missing)
            self._shape_cache.update(got)
            out.update(got)
        return out

    def _child_shapes(self, node_id: str) -> list[TopicShape]:
        ids = self._kids.get(node_id)
        if ids is not None:
            return list(self._shapes(ids).values())
        got = self.store.topic_shapes(self.user_id, parent_id=node_id)
        self._shape_cache.update(got)
        return list(self._shapes(got).values())

    def _candidates(self, vsum: np.ndarray, exclude: str | None) -> list[TopicShape]:
        """Leaves likely to be related: nearest topic vectors from the index (as of the last
        flush) plus every leaf this unit of work holds (not in the index yet)."""
        norm = float(np.linalg.norm(vsum)) or 1.0
        k = self.s.home_candidates
        hits = self.store.vector_search(self.user_id, "topic", (vsum / norm).astype(np.float32), k)
        held = [(i, node.vec_sum, node.size) for i, node in self._leaves.items()
                if node.size > 0 and node.vec_sum is not None and i != exclude]
        if len(held) > k:
            # A bulk unit of work holds hundreds of leaves; scoring each as a shape in Python
            # for every homing was most of add_many's CPU (O(chunk^2)). Only the k best by
            # average link can reach _find_home's top 8, so the rest are dropped in numpy.
            # (One concatenate, not np.stack: the same matrix at a quarter of the cost.)
            mat = np.concatenate([v for _, v, _ in held]).reshape(len(held), -1)
            links = (mat @ vsum) / np.array([n for _, _, n in held])
            held = [held[j] for j in np.argpartition(-links, k)[:k]]
        ids = [i for i, _ in hits] + [i for i, _, _ in held]
        return [sh for i, sh in self._shapes(ids).items()
                if i != exclude and sh.kind == "topic" and sh.size > 0]

    def _find_home(self, vsum: np.ndarray, n: int, exclude: str | None) -> _Home:
        leaves = self._candidates(vsum, exclude)
        scored = sorted(((self._link(vsum, n, leaf), leaf.id, leaf) for leaf in leaves),
                        key=lambda p: (-p[0], p[1]))
        home = _Home()
        if not scored:
            return home
        link, _, leaf = scored[0]
        if link >= self.s.thread_threshold and leaf.size + n <= self.s.max_topic_size \
                and not leaf.no_merge:
            home.thread = self.get(leaf.id)
            return home
        best = at = self._theme_at()
        theme = pair = None
        for link, _, leaf in scored[:8]:
            if link < at:
                break
            top = self._top_shape(leaf)
            if top.kind == "topic":
                if link > best:  # a lone related topic: the two become a theme
                    theme, pair, best = None, top.id, link
                continue
            tl = self._link(vsum, n, top)
            if tl > best:
                theme, pair, best = self._descend(vsum, n, top, at), None, tl
        home.theme = self.get(theme) if theme else None
        home.pair = self.get(pair) if pair else None
        return home

    def _top(self, node: TopicRecord) -> TopicRecord:
        """The top-level node (a child of the root) above ``node``, or ``node`` itself."""
        chain = [node, *self.ancestors(node)]
        return chain[-2] if len(chain) >= 2 else node

    def _top_shape(self, node: TopicShape) -> TopicShape:
        """``_top`` over shapes."""
        cur = node
        while cur.parent_id is not None:
            parent = self._shapes([cur.parent_id]).get(cur.parent_id)
            if parent is None or parent.parent_id is None:  # cur is at the top (or orphaned)
                return cur
            cur = parent
        return cur

    def _theme_at(self) -> float:
        """The average link at which a run joins a theme (or pairs with a lone topic):
        ``theme_threshold``, raised to ``theme_margin`` above the user's *background*, the mean
        cosine between any two of the user's exchanges (from the root's vector sum: O(1)).

        Why: in a memory where everything is somewhat alike (two friends catching up, one
        household's chat; LoCoMo's background is 0.46), every topic passed 0.25 and the whole
        conversation became one theme. The subject histories' background is 0.07-0.10, so
        the absolute threshold still decides there. The mean counts pairs within a topic too,
        which lifts it while a memory holds few topics: a young memory forms themes less
        readily, and its lone topics pair later as related ones arrive (docs/tree.md)."""
        background = self._background()
        if background is None:
            return self.s.theme_threshold
        return max(self.s.theme_threshold, background + self.s.theme_margin)

    def _background(self) -> float | None:
        """The mean cosine between two of the user's exchanges (None below two), O(1)."""
        root = self.root
        n = root.size
        if root.vec_sum is None or n < 2:
            return None
        total = float(root.vec_sum @ root.vec_sum)  # n (self-pairs) + the cosine of every ordered pair
        return (total - n) / (n * (n - 1))

    def _descend(self, vsum: np.ndarray, n: int, theme: TopicShape, at: float) -> str:
        """Within a subject theme, the sub-theme the run relates to best (while related)."""
        while True:
            subs = [c for c in self._child_shapes(theme.id) if c.kind == "theme"]
            scored = [(self._link(vsum, n, c), c.id, c) for c in subs]
            scored = [x for x in scored if x[0] >= at]
            if not scored:
                return theme.id
            theme = max(scored, key=lambda x: (x[0], x[1]))[2]

    def _pair_theme(self, leaf: TopicRecord) -> TopicRecord:
        """Wrap ``leaf`` in a new theme at its place (a related new topic joins it)."""
        old = self.get(leaf.parent_id) if leaf.parent_id else self.root
        assert old is not None
        theme = self._create("theme", old, leaf.created_seq)
        self._reparent(leaf, theme)
        self.recompute(theme)
        return theme

    def close(self, leaf: TopicRecord) -> None:
        """Freeze a topic the conversation left, and re-home it now that all of it is known
        (it was homed on its first exchanges): it may rejoin its thread or move to the theme
        it relates to best."""
        self.freeze(leaf)
        leaf.meta.pending = None
        leaf.meta.shift_p = []  # the session's judgements go on with its open topic (``place``)
        if leaf.size == 0 or leaf.vec_sum is None or leaf.meta.aliases:
            return
        home = self._find_home(leaf.vec_sum, leaf.size, exclude=leaf.id)
        old_parent = self.get(leaf.parent_id) if leaf.parent_id else None
        if home.thread is not None and home.thread.id != leaf.id:
            target = home.thread
            members = self.store.list_exchanges(self.user_id, topic_id=leaf.id)
            vecs = self.store.get_vectors(self.user_id, "exchange", [e.id for e in members])
            vecs.update({e.id: self._vecs[e.id] for e in members if e.id in self._vecs})
            for e in members:
                self.move(e, vecs.get(e.id), term_counts(e.text), target)
                self.moved[e.id] = target.id
            target.frozen = True
            self._to_summarise.add(target.id)
            self._dirty.add(target.id)
            return
        new_parent = home.theme
        if new_parent is None and home.pair is not None:
            if old_parent is not None and home.pair.parent_id == old_parent.id and old_parent.kind == "theme":
                return  # already siblings in a theme
            new_parent = self._pair_theme(home.pair)
        if new_parent is None or old_parent is None or new_parent.id == old_parent.id:
            return
        if any(a.id == leaf.id for a in [new_parent, *self.ancestors(new_parent)]):
            return
        if old_parent.kind == "theme" and self._link(leaf.vec_sum, leaf.size, old_parent) >= \
                self._link(leaf.vec_sum, leaf.size, new_parent):
            return
        self._move_subtree(leaf, new_parent)
        self.bound_fanout(new_parent, leaf.created_seq)

    def home_short(self, leaf: TopicRecord) -> tuple[TopicRecord, float, float] | None:
        """Consolidation's short-returns step: a closed topic (or small theme) of at most
        ``small_topic`` exchanges alone at the top level joins the bigger top-level branch it relates to best,
        when the average link reaches ``small_topic_slack`` below the theme threshold; under a
        theme it goes to the sub-theme it relates to best, beside a lone topic the two become a
        theme. Returns (its new parent, the link, the threshold), or None when it stays.

        Why a lower threshold, and only afterwards: a brief return to a subject ("the car has a
        slight oil leak") links weakly on average to that subject's many, varied exchanges, so
        placement left it beside the subject as a one-exchange branch. Judged on the grown
        tree, the subject it relates to best is usually its own (docs/tree.md, "Short
        returns"); judged while placing, before the subject's branch had grown, a lower
        threshold let early short topics pull unrelated subjects together.

        The best branch must also beat the next best by ``small_topic_gap``: a return relates
        to its own subject clearly more than to the others, while a one-off question ("Why do
        we get hiccups?") links about as weakly to several; on the subject histories more than
        half of the moves this step made without the gap were such questions or went to the
        wrong subject (docs/tree.md, "Short returns"). Even with the gap, a single exchange
        was as often a one-off as a return (12 and 14 of its moves on the subject histories,
        their links interleaved), so only topics of ``small_topic_min`` exchanges or more
        move (docs/tree.md, "One exchange alone stays alone")."""
        if leaf.parent_id != self.root.id or leaf.vec_sum is None \
                or not self.s.small_topic_min <= leaf.size <= self.s.small_topic \
                or self.s.small_topic_slack <= 0:
            return None
        big = [c for c in self.children(self.root) if c.id != leaf.id and c.size > self.s.small_topic]
        if not big:
            return None
        ranked = sorted(((self._link(leaf.vec_sum, leaf.size, c), c) for c in big), key=lambda p: (-p[0], p[1].id))
        link, target = ranked[0]
        at = self._theme_at() - self.s.small_topic_slack
        if link < at or (len(ranked) > 1 and link - ranked[1][0] < self.s.small_topic_gap):
            return None
        return self._join(leaf, target, at), link, at

    def home_namesake(self, node: TopicRecord) -> tuple[TopicRecord, float, float] | None:
        """Consolidation's namesakes step: a top-level node titled as another, bigger (or as big
        and older) top-level node joins it when their average link is at least the user's
        background, the mean link between any two of their exchanges (and at least the short
        returns' threshold, ``theme_threshold - small_topic_slack``). Returns (its new parent,
        the link, the threshold), or None when it stays.

        Why: in a memory where everything is alike (two friends catching up: LoCoMo's
        background is 0.46 with MiniLM) the vectors cannot tell two sessions on one subject
        from two subjects, and the top level read "Mental health", ..., "Mental health". Two
        branches whose best phrase is the same and which are no less related than any two
        exchanges are what a reader takes for one subject (docs/tree.md, "Short returns").
        Only at the top level and only between two nodes: placement-time grouping by equal
        phrases re-created one-theme blobs where one word dominates a conversation."""
        if node.parent_id != self.root.id or node.vec_sum is None or node.size <= 0 or not node.title:
            return None
        # Its title, or the one it was kept from by an earlier run (``distinguish_namesakes``):
        # the link is judged again, as the two may have grown closer since.
        keys = {labels.title_key(node.title), *node.meta.not_titled}
        order = (node.size, -node.created_seq)
        peers = [c for c in self.children(self.root)
                 if c.id != node.id and c.vec_sum is not None and c.size > 0 and c.title
                 and labels.title_key(c.title) in keys and (c.size, -c.created_seq) > order]
        if not peers:
            return None
        background = self._background()
        if background is None:
            return None
        # Never below a short return's threshold either: a memory configured without themes
        # (a theme threshold out of reach) gets none this way.
        at = max(background, self.s.theme_threshold - self.s.small_topic_slack)
        link, target = max(((self._link(node.vec_sum, node.size, c), c) for c in peers), key=lambda p: (p[0], p[1].id))
        if link < at:
            return None
        parent = target if target.kind == "theme" else self._pair_theme(target)
        self._move_subtree(node, parent)
        self.bound_fanout(parent, node.created_seq)
        return parent, link, at

    def distinguish_namesakes(self) -> list[TopicRecord]:
        """Consolidation's last step: top-level nodes that still share a title after the
        namesakes step (``home_namesake``: not related enough to join) are told apart. Each but
        the biggest keeps that title out (``meta.not_titled``) and takes its next phrase at
        flush; returns them. The open topic itself keeps its title while it grows; a theme
        holding it is told apart like any other (once only closed ones were: on a LoCoMo
        conversation the misplaced-topics step grouped moved topics into a new top-level theme
        titled as the open "Dance studio" theme, and both stayed).

        Why after the step and not while titling: the namesakes step reads equal titles as its
        signal that two branches are one subject, so titles must not be made distinct before
        it has judged them. A reader seeing "Kitchen" twice at the top level learns nothing
        from the second (docs/titles.md)."""
        groups: dict[str, list[TopicRecord]] = {}
        current = self.root.meta.current
        for c in self.children(self.root):
            if c.title and c.meta.phrases and not llm_labelled(c):
                groups.setdefault(labels.title_key(c.title), []).append(c)
        out = []
        for key, nodes in groups.items():
            if len(nodes) < 2:
                continue
            nodes.sort(key=_rank, reverse=True)
            for n in nodes[1:]:
                if n.id != current and key not in n.meta.not_titled:
                    n.meta.not_titled.append(key)
                    n.meta.titled = None  # due at flush
                    self._dirty.add(n.id)
                    out.append(n)
        return out

    def join_related(self) -> list[tuple[TopicRecord, TopicRecord, float, float]]:
        """Consolidation's related-branches step: two top-level branches join when their
        average link plus ``related_words`` times the words they share
        (``heuristics.shared_words``) reaches the theme threshold (``_theme_at``); the most
        related pair first, the smaller (on a tie the newer) moving under the bigger, into
        the sub-theme it relates to best (beside a lone topic the two become a theme). Only a
        closed branch moves, never the open topic or one a user sent back to the top. Returns
        (the node moved, its new parent, the score, the threshold) per move.

        Why: placement homes a run on what the vectors know when it arrives. Two visits to
        one subject months apart (couch grass and a manure pile in March; potatoes, onion sets
        and a frost forecast in May) can sit below the theme threshold by average link alone
        while both name the allotment, its beds and plot; on the subject histories the shared
        words separate a subject's visits from related subjects better than either signal
        alone (docs/tree.md, "Related branches"). The shared words count above their usual
        level between any two branches, so a memory where all branches share vocabulary (two
        friends catching up) gets no bonus. The top level is bounded (``root_children``), so
        the pairs are few."""
        weight = self.s.related_words
        if weight <= 0:
            return []
        at = self._theme_at()
        n_docs = max(1, self.root.size)
        current = self.root.meta.current
        df: dict[str, int] = {}

        def top_level() -> list[TopicRecord]:
            """The top-level branches, with the document frequencies of their words in ``df``."""
            tops = [c for c in self.children(self.root) if c.vec_sum is not None and c.size > 0]
            missing = {w for c in tops for w in c.terms if w not in df}
            if missing:
                got = self.store.get_term_df(self.user_id, sorted(missing))
                df.update({w: got.get(w, 0) for w in missing})
            return tops

        tops = top_level()
        pairs = [shared_words(a.terms, b.terms, df, n_docs) for i, a in enumerate(tops) for b in tops[i + 1:]]
        usual = sum(pairs) / len(pairs) if pairs else 0.0
        scores: dict[tuple[str, str], float] = {}
        moves: list[tuple[TopicRecord, TopicRecord, float, float]] = []
        while True:
            best: tuple[float, TopicRecord, TopicRecord] | None = None
            for i, a in enumerate(tops):
                for b in tops[i + 1:]:
                    key = (a.id, b.id) if a.id < b.id else (b.id, a.id)
                    score = scores.get(key)
                    if score is None:
                        assert a.vec_sum is not None
                        score = scores[key] = self._link(a.vec_sum, a.size, b) \
                            + weight * (shared_words(a.terms, b.terms, df, n_docs) - usual)
                    if score < at or (best is not None and score <= best[0]):
                        continue
                    mover, target = sorted((a, b), key=_rank)
                    if mover.frozen and mover.id != current and not mover.meta.stays:
                        best = (score, mover, target)
            if best is None:
                return moves
            score, mover, target = best
            moves.append((mover, self._join(mover, target, at), score, at))
            changed = {mover.id, target.id}
            scores = {k: v for k, v in scores.items() if not changed.intersection(k)}
            tops = top_level()

    def rehome_topics(self) -> list[tuple[TopicRecord, TopicRecord, TopicRecord, float, float]]:
        """Consolidation's misplaced-topics step: each closed topic under a top-level theme is
        judged against the grown tree. It moves to another top-level branch when its average
        link to that branch reaches the theme threshold (``_theme_at``) and beats its link to
        the rest of its own branch (into the sub-theme it relates to best, as ``_join``); it
        goes to the top level alone when it relates to nothing: its own branch below the short
        returns' threshold (``theme_threshold - small_topic_slack``, so the short-returns step
        cannot send it straight back) and no other branch at the theme threshold. Up to three
        passes, the branches' sums updated after each move. Returns (the topic, its old parent,
        its new parent, the link, the threshold) per move.

        Why: placement homes a run on what is known when it arrives, and a theme formed early
        keeps what it took: a heel blister filed under gout, a Bhutan capital question under
        a field trip. Judged later, a topic's best branch is its subject's more often than
        where it was first put (docs/tree.md, "Misplaced topics"). A topic alone at the top
        level is left to the other steps; a topic a user sent back (``meta.stays``) stays.
        Cost: one pass over the tree's topics and a (topics x top-level) product."""
        if not self.s.rehome_topics:
            return []
        tops = [c for c in self.children(self.root) if c.vec_sum is not None and c.size > 0]
        if len(tops) < 2:
            return []
        at = self._theme_at()
        branches = _Branches(tops, at, self.s.theme_threshold - self.s.small_topic_slack)
        rows = self._closed_below(tops)
        moves: list[tuple[TopicRecord, TopicRecord, TopicRecord, float, float]] = []
        seq = self.root.end_seq or 0
        for _ in range(3):
            # The most clearly misplaced first, each judged again under the sums as they are
            # by its turn (ids are random, so no order of the tree's own is reproducible).
            ranked = sorted((-x[0], r) for r, (sh, k) in enumerate(rows) if (x := branches.judge(sh, k)) is not None)
            moved = False
            for _gain, r in ranked:
                sh, k = rows[r]
                verdict = branches.judge(sh, k)
                if verdict is None:
                    continue
                leaf = self.get(sh.id)
                old = self.get(leaf.parent_id) if leaf is not None and leaf.parent_id else None
                if leaf is None or old is None or not leaf.frozen or leaf.meta.stays:
                    continue
                _, target, link = verdict
                if target < 0 and len(self.children(self.root)) >= self.s.root_children:
                    # A full top level is grouped again at once (``bound_fanout``): the topic
                    # would only go back under a theme, and the next round take it out again.
                    continue
                if target >= 0:
                    parent = self._join(leaf, branches.tops[target], at)
                    branches.tops[target] = self._top(parent)  # a lone topic joined is now a theme
                else:
                    self._move_subtree(leaf, self.root)
                    parent = self.root
                rows[r] = (sh, branches.move(sh, k, target, leaf))
                moves.append((leaf, old, parent, link, branches.alone_at if parent.id == self.root.id else at))
                moved = True
            if not moved:
                break
        if moves:
            self.bound_fanout(self.root, seq)
        return moves

    def _closed_below(self, tops: list[TopicRecord]) -> list[tuple[TopicShape, int]]:
        """Each topic below a top-level theme (not the open one), with its branch's index."""
        current = self.root.meta.current
        rows: list[tuple[TopicShape, int]] = []
        for k, top in enumerate(tops):
            stack = [top.id] if top.kind == "theme" else []
            while stack:
                for sh in self._child_shapes(stack.pop()):
                    if sh.kind == "theme":
                        stack.append(sh.id)
                    elif sh.size > 0 and sh.vec_sum is not None and sh.id != current:
                        rows.append((sh, k))
        return rows

    def _join(self, node: TopicRecord, target: TopicRecord, at: float) -> TopicRecord:
        """Move ``node`` into the top-level branch ``target``: into the sub-theme of a theme it
        relates to best (while at ``at`` or above), or beside a lone topic (the two become a
        theme). Returns its new parent."""
        assert node.vec_sum is not None
        if target.kind == "theme":
            shape = self._shapes([target.id])[target.id]
            parent = self.get(self._descend(node.vec_sum, node.size, shape, at)) or target
        else:
            parent = self._pair_theme(target)
        self._move_subtree(node, parent)
        self.bound_fanout(parent, node.created_seq)
        return parent

    def to_top(self, node: TopicRecord) -> None:
        """Move a node back to the top level (undoing ``home_short`` or ``home_namesake``)."""
        if node.parent_id != self.root.id:
            self._move_subtree(node, self.root)

    def put_under(self, node: TopicRecord, parent: TopicRecord) -> None:
        """Move a node under a theme (undoing a move of the misplaced-topics step)."""
        if node.parent_id != parent.id and not any(a.id == node.id for a in [parent, *self.ancestors(parent)]):
            self._move_subtree(node, parent)
            self.bound_fanout(parent, node.created_seq)

    def _move_subtree(self, node: TopicRecord, new_parent: TopicRecord) -> None:
        """Move a node (with its aggregates) under another parent, keeping every ancestor's
        sums, spans and sizes right on both paths."""
        old_chain = self.ancestors(node)
        self._reparent(node, new_parent)
        new_chain = [new_parent, *self.ancestors(new_parent)]
        # The ancestors both paths share are recomputed once, on the new path, after the
        # nodes below them on both sides: recompute is a function of the children, so
        # recomputing them first on the old path too only wrote values the second pass
        # replaced (a move within a subject rebuilt its whole chain twice).
        shared = {a.id for a in new_chain}
        for a in old_chain:
            if a.kind == "theme" and a.id not in shared:
                self.recompute(a)
        for a in new_chain:
            if a.kind == "theme":
                self.recompute(a)
        # A node moved beside a sibling of its title: the smaller takes its next phrase at
        # flush (``_title`` keeps a bigger sibling's title out; consolidation's moves join
        # visits of one subject, whose topics often share their best phrase).
        if new_parent.kind == "theme" and node.title:
            key = labels.title_key(node.title)
            for sib in self.children(new_parent):
                if sib.id != node.id and labels.title_key(sib.title) == key:
                    loser = sib if _outranks(node, sib) else node
                    loser.meta.titled = None  # due at flush
                    self._dirty.add(loser.id)

    def _add_to(self, leaf: TopicRecord, ex: Exchange, vec: np.ndarray, counts: Mapping[str, int]) -> None:
        phrases: dict[str, int] | None = None
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
                if phrases is None:
                    phrases = self._phrases_of(ex)
                node.meta.phrases = labels.prune_phrases(labels.merge_phrases(node.meta.phrases, phrases), keep)
            if i == 0 and not node.summary:
                node.summary = shorten(ex.user_text, 200)
            self._dirty.add(node.id)

    def _phrases_of(self, ex: Exchange) -> dict[str, int]:
        """The exchange's phrase counter (read-only), computed once per unit of work: an
        exchange moved by segmentation or a rejoined thread is removed from one path and
        added to another, and counting its phrases is a sixth of placing it. Keyed by the
        texts it is a function of, not the id, so an edited text is counted afresh."""
        key = (ex.user_text, ex.assistant_text)
        got = self._phrases.get(key)
        if got is None:
            got = self._phrases[key] = labels.exchange_phrase_counts(ex.user_text, ex.assistant_text)
        return got

    def remove(self, ex: Exchange, vec: np.ndarray | None, counts: Mapping[str, int]) -> None:
        """Take a deleted exchange out of its topic and the topic's ancestors."""
        if ex.topic_id is None:
            return
        leaf = self.get(ex.topic_id)
        if leaf is None:
            return
        if leaf.meta.aliases:
            # A merged topic's part centroids (organize/aliases.py) include this exchange.
            drop_aliases(self.store, leaf)
        chain = [leaf, *self.ancestors(leaf)]
        phrases = self._phrases_of(ex)
        for node in chain:
            if vec is not None and node.vec_sum is not None:
                node.vec_sum = node.vec_sum - vec
            node.size = max(0, node.size - 1)
            if node.kind != "root":
                node.terms = {t: c - counts.get(t, 0) for t, c in node.terms.items() if c - counts.get(t, 0) > 0}
                if node.meta.phrases:
                    node.meta.phrases = labels.subtract_phrases(node.meta.phrases, phrases)
            self._dirty.add(node.id)
        self._recompute_span(leaf)
        # Its summary may quote the removed exchange: rewritten from what is left at flush.
        self._to_summarise.add(leaf.id)
        # Drop nodes that became empty, bottom-up (the root stays).
        for node in chain:
            if node.kind != "root" and node.size <= 0:
                self.drop(node)

    def drop(self, node: TopicRecord) -> None:
        """Take ``node`` out of the tree (its row and index entries go at ``flush``). Its
        children, if any, must have been moved away first."""
        parent = self.get(node.parent_id) if node.parent_id else None
        if parent is not None:
            self.children(parent)
            if node.id in self._kids[parent.id]:
                self._kids[parent.id].remove(node.id)
            self._dirty.add(parent.id)
        if self.root.meta.current == node.id:
            self.root.meta.current = None
            self._dirty.add(self.root.id)
        self._deleted.add(node.id)
        self._dirty.discard(node.id)
        self._to_summarise.discard(node.id)
        self._nodes.pop(node.id, None)
        self._leaves.pop(node.id, None)

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
        if parent is not None and parent.kind != "theme":
            parent = None
        near = self.get(topic_id) if topic_id else None
        if parent is None:
            parent = self.get(near.parent_id) if near is not None and near.parent_id else None
        if parent is None:
            parent = self.root
        leaf = self._create("topic", parent, seq)
        for node in self.ancestors(leaf):
            self.bound_fanout(node, seq)
        return leaf

    def touch(self, node: TopicRecord, *, summarise: bool | None = None) -> None:
        """Mark a node for writing at ``flush``. ``summarise=True``: its labels and summary are
        recomputed from its exchanges then (its content changed); ``False``: they are kept as
        they are (the caller restored them)."""
        self._dirty.add(node.id)
        if node.parent_id:  # its parent's summary and state are rebuilt with it
            self._stale_summary.add(node.parent_id)
        if summarise:
            self._to_summarise.add(node.id)
        elif summarise is False:
            self._to_summarise.discard(node.id)

    def attach(self, rec: TopicRecord, parent: TopicRecord) -> None:
        """Put a node that is not in the tree (a restored topic) under ``parent``; written at
        ``flush``. The caller moves its exchanges and recomputes its aggregates."""
        rec.parent_id = parent.id
        self._hold(rec)
        self._kids.setdefault(rec.id, [])
        self._deleted.discard(rec.id)
        self.children(parent)
        self._kids[parent.id].append(rec.id)
        self._dirty.update({rec.id, parent.id})

    def refresh(self, nodes: Iterable[TopicRecord]) -> None:
        """Recompute the aggregates of ``nodes`` and all their ancestors (not the root) once
        each, deepest first, so a batch of edits costs one pass over the touched paths; an
        emptied theme is dropped."""
        depth: dict[str, int] = {}
        pending: dict[str, TopicRecord] = {}
        for n in nodes:
            for x in [n, *self.ancestors(n)]:
                if x.kind != "root" and x.id not in pending:
                    pending[x.id] = x
                    depth[x.id] = len(self.ancestors(x))
        for nid in sorted(pending, key=lambda i: -depth[i]):
            node = pending[nid]
            if node.id in self._deleted:
                continue
            if node.kind == "theme" and not self.children(node):
                self.drop(node)
            elif node.kind == "theme":
                self.recompute(node)

    def rebuild_leaf(self, leaf: TopicRecord) -> None:
        """Recompute a leaf's aggregates exactly from its stored exchanges (as placement built
        them); its labels are recomputed at ``flush``."""
        members = [e for e in self.store.list_exchanges(self.user_id, topic_id=leaf.id) if e.status == "completed"]
        vecs = self.store.get_vectors(self.user_id, "exchange", [e.id for e in members])
        rows = [vecs[e.id] for e in members if e.id in vecs]
        leaf.vec_sum = np.sum(rows, axis=0).astype(np.float32) if rows else None
        leaf.size = len(members)
        acc: dict[str, int] = {}
        for e in members:
            acc = merge_counts(acc, term_counts(e.text).items())
        leaf.terms = prune_counts(acc, LEAF_TERMS)
        if members:
            leaf.start_seq, leaf.end_seq = members[0].seq, members[-1].seq
            leaf.first_at = min(e.user_at for e in members)
            leaf.last_at = max(e.user_at for e in members)
        self.touch(leaf, summarise=True)

    def _recompute_span(self, leaf: TopicRecord) -> None:
        members = [e for e in self.store.list_exchanges(self.user_id, topic_id=leaf.id) if e.status == "completed"]
        if members:
            leaf.start_seq, leaf.end_seq = members[0].seq, members[-1].seq
            leaf.first_at = min(e.user_at for e in members)
            leaf.last_at = max(e.user_at for e in members)

    # -- fan-out -----------------------------------------------------------------------------------
    def bound_fanout(self, node: TopicRecord, seq: int) -> None:
        """Keep fan-out bounded where content is large.

        A theme with more than ``max_children`` children gets a level below it: its children
        are grouped (balanced spherical k-means on centroids: they already share the theme's
        subject) into sub-themes; a child left alone stays where it is. The top level is
        grouped the same way only past ``root_children`` (a memory with very many unrelated
        subjects: the one forced grouping, so depth stays logarithmic at a million
        exchanges). A small memory's subjects therefore stay apart at the top, and depth
        follows the content: only subjects with many topics get sub-themes.
        """
        kids = self.children(node)
        limit = self.s.root_children if node.kind == "root" else self.s.max_children
        if len(kids) <= limit:
            return
        cap = self.s.max_children
        k = max(2, math.ceil(len(kids) / cap))
        dim = next(c.vec_sum.shape[0] for c in kids if c.vec_sum is not None)
        zero = np.zeros(dim, dtype=np.float32)
        vecs = np.stack([_or(c.centroid(), zero) for c in kids])
        groups = balanced_groups(vecs, k, cap)
        parent = self.get(node.parent_id) if node.parent_id else None
        if node.kind == "theme" and parent is not None and parent.kind == "theme":
            self._split_up(node, parent, [[kids[j] for j in g] for g in groups], seq)
            return
        for group in groups:
            if len(group) < 2:
                continue
            theme = self._create("theme", node, seq)
            for j in group:
                self._reparent(kids[j], theme)
            self.recompute(theme)
            self.store.log_change(self.user_id, "split", theme.id, {
                "from": node.id, "children": [kids[j].id for j in group], "reason": "fan-out",
                "max_children": self.s.max_children,
            })

    def _split_up(self, node: TopicRecord, parent: TopicRecord, groups: list[list[TopicRecord]],
                  seq: int) -> None:
        """Split a full sub-theme into siblings under its parent, as a B-tree splits a full
        node: ``node`` keeps its largest group, each other group becomes a new sibling theme
        (a lone child moves up itself), and the parent's fan-out is bounded in turn. Pushing
        a level down at every overflow instead would grow depth linearly with a subject's
        topics (a 10k-exchange memory of one subject reached depth 37); splitting upward adds
        a level only when a subject's top theme itself overflows, so depth stays logarithmic.
        The ancestors' aggregates do not change: the same exchanges stay below them."""
        groups = sorted((g for g in groups if g), key=len, reverse=True)
        for group in groups[1:]:
            if len(group) == 1:
                self._reparent(group[0], parent)
                continue
            sib = self._create("theme", parent, seq)
            for kid in group:
                self._reparent(kid, sib)
            self.recompute(sib)
            self.store.log_change(self.user_id, "split", sib.id, {
                "from": node.id, "children": [kid.id for kid in group], "reason": "fan-out",
                "max_children": self.s.max_children,
            })
        self.recompute(node)
        self.bound_fanout(parent, seq)

    def _kids_changed(self, node_id: str) -> bool:
        """Whether this unit of work changed the node's list of children. A node it created
        always has: compared with no stored list, a theme made by a fan-out split and emptied
        again by later moves in the same run looked unchanged, was never dissolved, and was
        written as a theme without children (the crash test caught one in 200 kills)."""
        kids = self._kids.get(node_id)
        return kids is not None and (node_id in self._born or tuple(kids) != self._kids_stored.get(node_id, ()))

    def _dissolve_chains(self) -> None:
        """A theme with one child is that child (no single-child chains); an empty one goes."""
        changed = True
        while changed:
            changed = False
            for nid in sorted(self._dirty, key=lambda i: (self._born.get(i, -1), i)):
                node = self._nodes.get(nid)
                if node is None or node.kind != "theme" or nid in self._deleted \
                        or not self._kids_changed(nid):
                    continue
                kids = self.children(node)
                if len(kids) > 1:
                    continue
                parent = self.get(node.parent_id) if node.parent_id else None
                if parent is None:
                    continue
                for kid in kids:
                    self._reparent(kid, parent)
                self.drop(node)
                changed = True
                break

    def recompute(self, node: TopicRecord) -> None:
        """Rebuild an inner node's aggregates from its children."""
        kids = self.children(node)
        sums = [c.vec_sum for c in kids if c.vec_sum is not None]
        node.vec_sum = np.sum(sums, axis=0).astype(np.float32) if sums else None
        node.size = sum(c.size for c in kids)
        # Summed in place (merge_counts/merge_phrases copy the sum so far for every child:
        # the same totals in the same key order, at a fraction of the cost for a wide theme).
        terms_acc: dict[str, int] = {}
        for c in kids:
            _add_counts(terms_acc, c.terms)
        node.terms = prune_counts(terms_acc, THEME_TERMS)
        phrases: dict[str, int] = {}
        for c in kids:
            _add_counts(phrases, c.meta.phrases)
        node.meta.phrases = labels.prune_phrases(phrases, THEME_TERMS)
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
                  keywords: list[str], summary: str, retrieval_terms: list[str], trigger: str) -> bool:
        """Store labels validated by the organiser's LLM (``organize/enrich.py``).

        Refused (False) when the topic changed since the labels were asked for. ``flush``
        keeps them while the topic keeps that size; the parent is refreshed because a
        theme's summary lists its children's titles.
        """
        node = self.get(topic_id)
        if node is None or node.kind != "topic" or node.size != expect_size or node.end_seq != expect_end:
            return False
        node.title, node.keywords, node.summary = title, list(keywords), summary
        node.meta.label_source, node.meta.label_size = "llm", node.size
        node.meta.retrieval_terms, node.meta.trigger = list(retrieval_terms), trigger
        self._dirty.add(node.id)
        if node.parent_id and self.get(node.parent_id) is not None:
            self._dirty.add(node.parent_id)
            self._stale_summary.add(node.parent_id)
        return True

    def flush(self) -> list[str]:
        """Write every changed node (row, centroid, text index); return their ids."""
        self._dissolve_chains()
        # Deepest first: a theme's summary and frozen flag are computed from its children,
        # which must be final by then (set order would make the stored tree vary run to run).
        dirty = sorted((self._nodes[i] for i in self._dirty if i in self._nodes),
                       key=lambda n: (-len(self.ancestors(n)), n.created_seq, self._born.get(n.id, -1), n.id))
        n_docs = max(1, self.root.size)
        due = {n.id for n in dirty if n.kind != "root" and not llm_labelled(n) and self._title_due(n)}
        # A theme's keywords, like its title, are recomputed only when due: one more exchange
        # among hundreds does not change them, and ranking every ancestor's terms on every
        # exchange was a fifth of a placement's cost.
        keyed = [n for n in dirty if n.kind != "root" and not llm_labelled(n) and (n.kind == "topic" or n.id in due)]
        wanted = {t for node in keyed for t in node.terms}
        for node in dirty:
            if node.id in due:
                wanted |= labels.phrase_words(node.meta.phrases)
        df = self.store.get_term_df(self.user_id, list(wanted)) if wanted else {}
        idfs: dict[str, float] = {}  # each term's idf, computed once per flush
        # A theme's summary (its children's titles) and frozen flag are rebuilt only when a
        # child was retitled, closed or moved: reading every ancestor's children on every
        # exchange was most of one-by-one ingest's tree cost.
        stale = self._stale_summary
        retitled: list[TopicRecord] = []  # children that took another title than their theme's
        for node in dirty:
            if node.kind == "root" or llm_labelled(node):
                continue
            if node.kind == "topic" or node.id in due:
                node.keywords = top_terms(node.terms, df, n_docs, KEYWORDS, idfs)
            if node.id in due:
                before = node.title
                node.title = self._title(node, df, n_docs)
                node.meta.titled = (node.size, len(self.children(node)) if node.kind == "theme" else 0)
                if node.title != before and node.parent_id:
                    stale.add(node.parent_id)
                    retitled.extend(self._unshare(node, df, n_docs))
                # Also when the title stayed but the children changed: a branch joined under
                # a namesake (consolidation's namesakes step) arrives titled as its new parent.
                if node.kind == "theme":
                    retitled.extend(self._unrepeat(node, df, n_docs))
            if node.id in self._to_summarise and node.parent_id:
                stale.add(node.parent_id)
            if node.id in self._to_summarise and node.kind == "topic":
                node.summary = self._extractive_summary(node, df, n_docs)
            elif node.kind == "theme" and (node.id in stale or node.id in due or self._kids_changed(node.id)):
                kids = self.children(node)
                parts = sorted(kids, key=lambda k: (k.start_seq or 0, k.id))
                node.summary = shorten("; ".join(k.title for k in parts if k.title), 240)
                node.frozen = all(k.frozen for k in kids) if kids else node.frozen
        held = {n.id for n in dirty}
        dirty += list({k.id: k for k in retitled if k.id not in held}.values())
        for node in dirty:
            self.store.put_topic(node)
        vec_nodes = []
        for n in dirty:
            c = n.centroid() if n.kind != "root" else None
            if c is not None and not self._centroid_kept(n, c):
                vec_nodes.append((n.id, c))
                self._stored_vec[n.id] = c
        if vec_nodes:
            self.store.put_vectors(self.user_id, "topic", [i for i, _ in vec_nodes],
                                   np.stack([c for _, c in vec_nodes]))
        for node in dirty:
            if node.kind != "root":
                text = topic_index_text(node)
                if self._stored_text.get(node.id) != text:
                    self.store.put_text(self.user_id, "topic", node.id, text)
                    self._stored_text[node.id] = text
        for topic_id in self._deleted:
            self.store.delete_topic(topic_id)
        ids = [n.id for n in dirty]
        self._shape_cache.clear()
        self._stale_summary.clear()
        self._dirty.clear()
        self._deleted.clear()
        self._to_summarise.clear()
        return ids

    def _centroid_kept(self, node: TopicRecord, centroid: np.ndarray) -> bool:
        """Whether a theme's stored centroid may stay: one more exchange among hundreds
        turns it by a hair (cosine >= ``_THEME_VEC_KEEP`` to the stored one). A leaf's
        centroid is always rewritten: homing finds leaves by it. The stored vector sum
        stays exact; the bound holds against the stored centroid, so drift cannot build up."""
        stored = self._stored_vec.get(node.id)
        return node.kind == "theme" and stored is not None and float(stored @ centroid) >= _THEME_VEC_KEEP

    def _title_due(self, node: TopicRecord) -> bool:
        """Whether the offline title must be recomputed: always for a closing or small node,
        otherwise once its size moved by an eighth or its children changed. Titling every
        ancestor on every exchange cost ~3 ms per theme (phrase ranking) and made one-by-one
        ingest 4x slower than embedding; a big node's best phrase does not change with one
        more exchange."""
        if not node.title or node.id in self._to_summarise:
            return True
        at = node.meta.titled
        if at is None:
            return True
        if node.kind == "theme" and self._kids_changed(node.id):
            return True
        return bool(abs(node.size - at[0]) * 8 >= max(1, at[0]))

    def _title(self, node: TopicRecord, df: Mapping[str, int], n_docs: int) -> str:
        """A noun phrase from the node's own text (organize/labels.py); a theme's names what
        its children share. Nodes stored before phrase counters existed fall back to their
        keywords until ``arbormem rebuild-tree``."""
        parent = self.get(node.parent_id) if node.parent_id else None
        # Not its theme's title, nor a part of it ("Hearing" under "Hearing aids")...
        within = [parent.title] if parent is not None and parent.kind == "theme" and parent.title else []
        # ... nor a bigger top-level namesake's it was not joined to (``distinguish_namesakes``)
        avoid = within + node.meta.not_titled
        # ... nor a bigger sibling's under a theme ("Bla Bheinn", "Bla Bheinn" under one walk
        # told a reader nothing of the second; ``_unshare``). At the top level equal titles are
        # the namesakes step's signal, so they are told apart only after it.
        if parent is not None and parent.kind == "theme":
            avoid += [k.title for k in self.children(parent) if k.title and _outranks(k, node)]
        phrases = node.meta.phrases
        # Themes and one-offs only are titled by closeness: a topic under a theme says what
        # sets it apart from its siblings, which the phrase nearest its own centroid mostly
        # does not (docs/titles.md, "Nearest phrase"). A theme's opening message is read once.
        near = self._closeness(node) if node.kind == "theme" or self._one_off(node) else None
        # A topic of several exchanges alone at the top level is a subject of its own: its first
        # message names it ("my knee started hurting at footy"), where its counts may rank a
        # phrase said once ("single leg" squats) first (docs/titles.md, "A topic's opening message").
        alone = node.kind == "topic" and node.parent_id == self.root.id and node.size >= 2
        opening = self._opening(node) if (near is not None and node.kind == "theme") or alone else frozenset()
        if node.kind == "theme":
            children = self.children(node)
            kids = [k.meta.phrases for k in children]
            if any(kids):
                below = [k.title for k in children if k.title]
                title = labels.theme_title(kids, df, n_docs, members=node.size, avoid=below,
                                           closeness=near, opening=opening)
                # A sub-theme titled as the theme above it takes its own next phrase instead
                # (none of its children's either).
                if not phrases or labels.says_more(avoid, within)(title):
                    return title
                avoid += below
        if phrases:
            return labels.make_title(phrases, df, n_docs, members=node.size, avoid=avoid, within=within,
                                     closeness=near, opening=opening)
        return keyword_title(node.keywords)

    def _one_off(self, node: TopicRecord) -> bool:
        """A closed single-exchange topic at the top level: a one-off question ("Crossword
        clue: ..."), whose counts rank its side words as high as its subject ("Superb ream"),
        so it is titled by closeness like a theme. Only these: closed topics of any size
        at the top level moved LoCoMo by two questions (docs/titles.md)."""
        return node.kind == "topic" and node.frozen and node.size == 1 and node.parent_id == self.root.id

    def _opening(self, node: TopicRecord) -> frozenset[str]:
        """The words of a theme's first user message (``labels.theme_title``): one indexed
        read, only when the title is due and title vectors are on."""
        if node.start_seq is None:
            return frozenset()
        first = self.store.exchanges_by_seq(self.user_id, [node.start_seq])
        return labels.opening_words(first[0].user_text) if first else frozenset()

    def _closeness(self, node: TopicRecord) -> labels.Closeness | None:
        """Cosines of candidate titles to the node's centroid, when the embedder can say."""
        if self.phrases is None:
            return None
        centroid = node.centroid()
        return None if centroid is None else functools.partial(self.phrases.closeness, centroid=centroid)

    def _unrepeat(self, theme: TopicRecord, df: Mapping[str, int], n_docs: int) -> list[TopicRecord]:
        """Children (topics and sub-themes, offline titles) whose title is the theme's, or a
        part of it, retitled with their next phrase: a node titled as its theme says nothing of
        what sets it apart.
        (A child titled after its theme avoids the theme's title in ``_title``; this handles
        the theme being titled after its children, as flush does, deepest first, and a child
        arriving under a theme that already wears its title. Flush calls it for every theme
        it retitles, so the common case, no child titled so, compares words and nothing more.)"""
        out = []
        for kid in self.children(theme):
            if not labels.repeats(kid.title, theme.title) or llm_labelled(kid) or not kid.meta.phrases:
                continue
            if self._retitle(kid, df, n_docs):  # now avoids the theme's new title
                out.append(kid)
                out.extend(self._unshare(kid, df, n_docs))  # a smaller sibling may wear it
        return out

    def _unshare(self, node: TopicRecord, df: Mapping[str, int], n_docs: int) -> list[TopicRecord]:
        """Smaller siblings under a theme that wear ``node``'s new title, retitled with their
        next phrase (``_title`` keeps a bigger sibling's title out). Reads the siblings only
        when ``node``'s title changed."""
        parent = self.get(node.parent_id) if node.parent_id else None
        if parent is None or parent.kind != "theme":
            return []
        key = labels.title_key(node.title)
        out = []
        for kid in self.children(parent):
            if kid.id == node.id or labels.title_key(kid.title) != key or not _outranks(node, kid) \
                    or llm_labelled(kid) or not kid.meta.phrases:
                continue
            if self._retitle(kid, df, n_docs):
                out.append(kid)
        return out

    def _retitle(self, kid: TopicRecord, df: Mapping[str, int], n_docs: int) -> bool:
        """Title ``kid`` again (the document frequencies of its phrases' words read where
        ``df``, the flush's, lacks them); whether its title changed."""
        words = labels.phrase_words(kid.meta.phrases)
        known = {**df, **self.store.get_term_df(self.user_id, [w for w in words if w not in df])}
        title = self._title(kid, known, n_docs)
        if title == kid.title:
            return False
        kid.title = title
        return True

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


def _rank(node: TopicRecord) -> tuple[int, int, str]:
    """Of two nodes the one with the higher rank stays (keeps a title they share; is the one
    the other moves under): the bigger, on a tie the older."""
    return node.size, -node.created_seq, node.id


def _outranks(a: TopicRecord, b: TopicRecord) -> bool:
    """Does sibling ``a`` keep a title it shares with ``b`` (``_rank``)?"""
    return a.id != b.id and _rank(a) > _rank(b)


#: Cosine to its stored centroid at which a theme's centroid is not rewritten (flush).
_THEME_VEC_KEEP = 0.9995
#: How many of a session's shift-head judgements placement keeps for the spike test (a
#: median of the recent ones; an open topic's meta carries them).
_SHIFT_HISTORY = 24


class _Branches:
    """The top-level branches as the misplaced-topics step sees them (``rehome_topics``):
    each one's node, vector sum and size, kept up to date as topics move between them."""

    def __init__(self, tops: list[TopicRecord], at: float, alone_at: float) -> None:
        self.tops = tops
        self.sums = np.stack([t.vec_sum for t in tops if t.vec_sum is not None]).astype(np.float64)
        self.sizes = np.array([t.size for t in tops], dtype=np.float64)
        self.at, self.alone_at = at, alone_at

    def judge(self, sh: TopicShape, k: int) -> tuple[float, int, float] | None:
        """For a topic in branch ``k``: (how clearly it is misplaced, the branch it belongs to
        or -1 for the top level alone, the link), or None when it stays."""
        assert sh.vec_sum is not None
        v, n = sh.vec_sum.astype(np.float64), sh.size
        rest = self.sizes[k] - n
        if rest <= 0:
            return None  # alone in its branch: the other steps judge it
        raw = self.sums @ v
        own = (float(raw[k]) - float(v @ v)) / (n * rest)
        links = raw / (n * self.sizes)
        links[k] = -np.inf
        j = int(np.argmax(links))
        if links[j] >= self.at and links[j] > own + _REHOME_MARGIN:
            return float(links[j] - own), j, float(links[j])
        if own < self.alone_at - _REHOME_MARGIN and links[j] < self.at:
            return float(self.alone_at - own), -1, own
        return None

    def move(self, sh: TopicShape, k: int, target: int, leaf: TopicRecord) -> int:
        """Account a move from branch ``k`` to ``target`` (-1: a new top-level branch, the
        topic itself); returns the topic's branch index."""
        assert sh.vec_sum is not None
        v = sh.vec_sum.astype(np.float64)
        if target < 0:
            self.tops.append(leaf)
            self.sums = np.vstack([self.sums, np.zeros_like(v)])
            self.sizes = np.append(self.sizes, 0.0)
            target = len(self.tops) - 1
        self.sums[target] += v
        self.sizes[target] += sh.size
        self.sums[k] -= v
        self.sizes[k] -= sh.size
        return target


@dataclasses.dataclass
class _Home:
    """Where a run of exchanges belongs: an earlier topic of its thread, a theme, or beside a
    lone related topic (``pair``); all None means a new top-level topic."""

    thread: TopicRecord | None = None
    theme: TopicRecord | None = None
    pair: TopicRecord | None = None


# Words of a closing exchange ("thanks, that's all", "great, bye"): pleasantries, assent and
# the words around them. An exchange whose user message holds one of the KEY words and at
# most one word outside this list closes its topic (TRACE's trivial exchanges, used as a cue).
_CLOSING_WORDS = frozenset("""thanks thank thx ty cheers bye goodbye great perfect ok okay alright
    fine cool awesome wonderful brilliant excellent lovely nice helpful help that's that is all
    i i'm i've need needed it everything for now appreciate appreciated much you very so good
    day have a the you're welcome that'll will be was just what wanted got sorted done amazing
    super again anyway then night evening morning see later take care""".split())
_CLOSING_KEYS = frozenset("thanks thank thx ty cheers bye goodbye all".split())
_WORDS = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)?")


def _user_words(ex: Exchange) -> int:
    """Words in the user's message, as placement's length rules count them (a short reply; a
    full message)."""
    return _words_in(ex.user_text)


def _words_in(text: str) -> int:
    """Words in ``text``'s first 400 characters (past that it is long anyway), numbers aside."""
    return len(_WORDS.findall(text[:400]))


# A message that announces its own change of subject, in its first words: "Different topic:
# ...", "Sorry, back to the wedding quickly", "Unrelated, but ...", "On another note". Such a
# cue is rare and unambiguous; the shift head, trained on dialogues that seldom say it, can
# miss it when the subjects are close (a honeymoon and the wedding). It may follow a word of
# assent or thanks ("Brilliant. Different question, ...", "Got it. Separate thing, ..."). English only.
_SHIFT_CUE = re.compile(
    r"^\W*(?:(?:ok(?:ay)?|so|sorry|anyway|oh|right|also|and|alright|great|cool|brilliant|perfect|fine|lovely|"
    r"excellent|awesome|nice|good|thanks|thank you|got it)\W+){0,3}(?:"
    r"(?:an?\s+)?(?:(?:totally|completely)\s+)?(?:different|unrelated|random|separate)\s+"
    r"(?:topic|subject|thing|question|note)\b|"
    r"(?:on\s+)?(?:an?\s+)?(?:another|other|new)\s+(?:topic|subject|note)\b|"
    r"unrelated\b|change of (?:subject|topic)|changing (?:the )?(?:subject|topic)|switching (?:gears|topics?)|"
    r"back to (?:the|my|our|that|this)\b|going back to\b)",
    re.IGNORECASE)


def _stems(text: str) -> set[str]:
    return {stem(t) for t in terms(text) if not number_only(t)}


def _terse(words: int, ex: Exchange, *earlier: Exchange | None) -> bool:
    """Do the replies of ``ex`` and the ``earlier`` exchanges of its session average fewer
    than ``words`` words (0: never)? A memory of user messages alone (no replies) is not terse:
    it says nothing of the conversation's style."""
    counts = [_words_in(e.assistant_text) for e in (ex, *earlier) if e is not None]
    return words > 0 and 0 < sum(counts) < words * len(counts)


def _picks_up(user_text: str, prev: Exchange) -> bool:
    """Does the user's message pick up a word the last reply brought in (one the user had not
    said)? "Sorry, what does flashing mean?" after "save energy for the ones you can flash".
    Words the user said before ("need", "week") or numbers are no such sign."""
    return bool(_stems(user_text) & (_stems(prev.assistant_text) - _stems(prev.user_text)))


# A message that adds another request: "Also, can I get my inhaler refilled?", "can I also
# book the parent-teacher conference", "one more thing", "while I have you", "Last thing, ...",
# "While I'm at it, ...". Said to an agent,
# it nearly always opens a new task; "also" inside a statement ("I also love grilling", "they
# also enjoy maths") does not count: chit-chat says it that way. English only (docs/tree.md,
# "Added requests").
_REQUEST_CUE = re.compile(
    r"(?:^|[.!?;:]\s*)(?:(?:and|oh|ok|okay|so|but|great|thanks|perfect|cool)[,.!]?\s+){0,2}also\b|"
    r"\b(?:can|could|would|will|do|may)\s+(?:you|i|we)\s+also\b|"
    r"\b(?:i|we)\s+also\s+(?:need|want|would|have to|got to|gotta)\b|"
    r"\balso\s+(?:need|want|book|add|get|set|check|can|could|do|is|are|what|how|when|where|please)\b|"
    r"\bone more (?:thing|question)\b|\bwhile i have you\b|\bseparately\b|\blastly\b|\banother thing\b|"
    r"\bone (?:last|final|other) thing\b|"
    r"(?:^|[.!?;:]\s*)(?:(?:ok|okay|right|yes|and|oh|so)[,.!]?\s+){0,2}(?:(?:last|final|next) thing\b|"
    r"while (?:i'm|i’m|im|i am) (?:at it|on|here)\b)")


# Words by which a short message points back at what was just said: "Does *it* have parking?",
# "Do *they* deliver?", "Is *there* a dress code?". "It" of the weather ("will it rain") is no
# such pointer.
_BACK = re.compile(r"\b(?:it|its|it's|they|them|their|those|this|these|there|he|she|him|her|his|"
                   # "that" as a conjunction ("text Sarah that I'll be late") points at nothing
                   r"that(?!\s+(?:i|i'm|i'll|i've|i'd|we|we're|we'll|you|you're|you'll)\b))\b")
_WEATHER_IT = re.compile(r"\bit\b(?:\s+\S+){0,2}\s+(?:rain|raining|snow|snowing|sunny|cold|hot|warm|windy|freezing|cloudy)\b")


def _asks_anew(s: TreeSettings, p: float, user_text: str) -> bool:
    """Do the user's words start another task, where the shift head gives ``p``? A message
    that adds a request ("can I also book...", "one more thing") or a command that names its
    own object ("set the heat to 68", "call mum"; not "book it for Friday", which points back
    with ``_BACK``'s words) opens a task the head often scores low: on blind task dialogues it
    gave 0.2-0.3 at such openings (docs/tree.md, "Added requests", "Commands")."""
    return (p >= s.request_p and adds_request(user_text)) or \
        (p >= s.command_p and gives_command(user_text) and not _points_back(user_text))


def _points_back(user_text: str) -> bool:
    """Does the user's message hold one of ``_BACK``'s words (in its first 200 characters)?"""
    return _BACK.search(user_text[:200].lower()) is not None


def _refers_back(user_text: str, words: int) -> bool:
    """Is the user's message a short one (at most ``words`` words as ``_words_in`` counts them,
    like placement's other length rules; 0: never) that points back at what was just said
    (``_points_back``), the weather's "it" aside?"""
    head = user_text[:200].lower()
    return 0 < words and _words_in(user_text) <= words and _points_back(user_text) and _WEATHER_IT.search(head) is None


# A message that opens with a command verb: "set the heating to 21", "text Jake I'm running
# late", "book me a taxi". English only (docs/tree.md, "Commands").
_COMMAND = re.compile(
    r"^\W*(?:please\s+)?(?:set|call|text|message|play|turn|remind|wake|navigate|add|open|start|find|book|"
    r"order|send|schedule|show|check|cancel|read|dim|lock|unlock|take|get|put|log|record|mute|pause|"
    r"resume|skip|increase|decrease|switch)\b")


def gives_command(user_text: str) -> bool:
    """The user's message opens with a command verb (``_COMMAND``)."""
    return _COMMAND.match(user_text[:100].lower()) is not None


# "And can you book us a taxi home?", "ok, and do you sell flea treatment": a request joined on
# with "and", asking the agent anew; one that points back ("and can I get a room there?") asks
# about what was just said.
_AND_ASKS = re.compile(
    r"^\W*(?:(?:oh|ok|okay|great|cool|thanks|right|perfect|brilliant|lovely)[,.!]?\s+){0,2}"
    r"and\W+(?:can|could|would|do|does)\W+(?:i|you|we|someone|u)\b")


def adds_request(user_text: str) -> bool:
    """The user's message adds another request (``_REQUEST_CUE``, or ``_AND_ASKS`` pointing at
    nothing just said)."""
    low = user_text[:400].lower()
    return _REQUEST_CUE.search(low) is not None or (
        _AND_ASKS.search(low) is not None and not _points_back(user_text))


def announces_shift(user_text: str) -> bool:
    """The user's message says it changes the subject (``_SHIFT_CUE``)."""
    return _SHIFT_CUE.match(user_text[:120]) is not None


def is_closing(user_text: str) -> bool:
    """A closing exchange: thanks or goodbye with (almost) nothing else to say."""
    words = [w.replace("’", "'") for w in _WORDS.findall(user_text.lower()[:200])]
    if not words or len(words) > 12:
        return False
    if not any(w in _CLOSING_KEYS for w in words):
        return False
    return sum(w not in _CLOSING_WORDS for w in words) <= 1


def _add_counts(acc: dict[str, int], counts: Mapping[str, int]) -> None:
    """Add ``counts`` into ``acc`` in place (new keys appended in their order)."""
    get = acc.get
    for t, c in counts.items():
        acc[t] = get(t, 0) + c


def _or(vec: np.ndarray | None, default: np.ndarray) -> np.ndarray:
    return default if vec is None else vec


def keyword_title(keywords: list[str]) -> str:
    """The title of a node with no phrase to title it (one stored before phrase counters, or
    whose text is all numbers and units: "5 miles in km?"): its best keyword that is not a
    number, capitalised. Not the top three joined ("Miles · Km · 5"): keyword triples with
    number-only words were what issue 17 found wrong with the titles."""
    words = [k for k in keywords if not number_only(k)]
    return words[0][:1].upper() + words[0][1:] if words else "Untitled"


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
        order = np.argsort(-sims.max(axis=1)).tolist()
        # Every item's groups by preference in one call, walked as Python ints (an argsort
        # and numpy scalars per item were most of a split's cost; the same order per row).
        prefs = np.argsort(-sims, axis=1).tolist()
        load = [0] * k
        for i in order:
            for g in prefs[i]:
                if load[g] < cap:
                    assign[i] = g
                    load[g] += 1
                    break
        for g in range(k):
            members = unit[assign == g]
            if len(members):
                m = members.sum(axis=0)
                c[g] = m / (np.linalg.norm(m) or 1.0)
    groups: list[list[int]] = [[] for _ in range(k)]
    for i, g in enumerate(assign.tolist()):
        groups[g].append(i)
    return groups

