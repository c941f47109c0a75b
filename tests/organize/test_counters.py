"""The bounded counters and rankings placement rewrites for every exchange keep their defined
order when computed the faster way (organize/tree.py, organize/labels.py, text.py): the
stored counters, keywords and tree depend on it."""

from __future__ import annotations

import heapq
import math
import random

import numpy as np

from arbormem.organize.labels import phrase_counts, prune_phrases
from arbormem.organize.tree import KEYWORDS, balanced_groups
from arbormem.text import idf, prune_counts, top_terms

WORDS = [f"w{i:03d}" for i in range(400)] + ["half marathon", "kitchen renovation budget", "Lisbon"]


def counters(n: int, seed: int = 3) -> list[dict[str, int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        d: dict[str, int] = {}
        for _ in range(rng.randint(1, 300)):
            w = rng.choice(WORDS)
            d[w] = d.get(w, 0) + rng.choice((1, 1, 2, 3, 9))
        out.append(d)
    return out


def test_prune_counts_keeps_the_top_by_count_then_term_in_that_order() -> None:
    for d in counters(300):
        want = dict(sorted(d.items(), key=lambda kv: (-kv[1], kv[0]))[:96]) if len(d) > 96 else d
        assert list(prune_counts(d, 96).items()) == list(want.items())


def test_prune_phrases_ranks_by_count_then_length_then_key() -> None:
    for d in counters(300, seed=4):
        ranked = sorted(d.items(), key=lambda kv: (-kv[1], -kv[0].count(" "), kv[0]))
        want = dict(ranked[:128]) if len(d) > 128 else d
        assert list(prune_phrases(d, 128).items()) == list(want.items())


def test_top_terms_with_a_shared_idf_memo_ranks_as_before() -> None:
    # The reference: top_terms as it was, the idf computed per term per call.
    def reference(counts: dict[str, int], df: dict[str, int], n_docs: int, k: int) -> list[str]:
        return [t for t, _ in heapq.nsmallest(
            k, counts.items(), key=lambda kv: (-(1.0 + math.log(kv[1])) * idf(df.get(kv[0], 1), n_docs), kv[0]))]

    rng = random.Random(5)
    idfs: dict[str, float] = {}  # shared across counters, as in one flush
    df = {w: rng.randint(1, 50) for w in WORDS if rng.random() < 0.8}
    for d in counters(200, seed=6):
        assert top_terms(d, df, 60, KEYWORDS, idfs) == reference(d, df, 60, KEYWORDS)
        assert top_terms(d, df, 60, KEYWORDS) == reference(d, df, 60, KEYWORDS)
    assert idfs and all(v == idf(df.get(t, 1), 60) for t, v in idfs.items())


def test_balanced_groups_assigns_by_preference_within_capacity() -> None:
    # The reference: the per-item loop it replaced (one argsort per item).
    def reference(vecs: np.ndarray, k: int, cap: int, iters: int = 6) -> list[list[int]]:
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
            load: dict[int, int] = {}
            for i in np.argsort(-sims.max(axis=1)):
                for g in np.argsort(-sims[i]):
                    if load.get(int(g), 0) < cap:
                        assign[i] = int(g)
                        load[int(g)] = load.get(int(g), 0) + 1
                        break
            for g in range(k):
                members = unit[assign == g]
                if len(members):
                    m = members.sum(axis=0)
                    c[g] = m / (np.linalg.norm(m) or 1.0)
        return [[i for i in range(n) if assign[i] == g] for g in range(k)]

    rng = np.random.default_rng(2)
    for t in range(200):
        n = int(rng.integers(3, 30))
        vecs = rng.normal(size=(n, 16)).astype(np.float32)
        if t % 3 == 0:
            vecs[rng.integers(0, n, 2)] = 0  # nodes without a centroid
        cap = int(rng.integers(3, 9))
        k = max(2, math.ceil(n / cap))
        assert balanced_groups(vecs, k, cap) == reference(vecs, k, cap)


def test_phrase_counts_key_order_is_first_sighting() -> None:
    # Counters are stored as JSON objects: the key order is part of the stored row.
    got = phrase_counts("Maya's birthday party in Lisbon: we booked the half marathon. Thanks, Gina!")
    assert list(got.items()) == [("maya", 1), ("maya's birthday", 1), ("maya's birthday party", 1), ("birthday", 1),
                                 ("birthday party", 1), ("party", 1), ("lisbon", 1), ("Lisbon", 1),
                                 ("half marathon", 1), ("marathon", 1)]
