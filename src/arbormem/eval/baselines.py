"""Flat retrieval baselines over the same exchange units and token budgets as arbormem.

These are what a user would pick instead of a topic tree: the newest exchanges (a sliding
window), BM25 alone, dense retrieval alone with the same embedding model, and a BM25 + dense
hybrid fused with reciprocal-rank fusion (RRF). Each ranks the units, then ``pack`` fills the
budget greedily in rank order with the same rendering for every baseline.

BM25 is implemented here (Okapi, k1=1.2, b=0.75, lower-cased word tokens minus a short stop
list) rather than borrowed from the store, so the baseline does not move when the library's
own index changes.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

_WORD = re.compile(r"\w+", re.UNICODE)
_STOP = frozenset(
    "a an the and or but of to in on at for with is are was were be been being it its this that "
    "these those i you he she we they me him her us them my your his our their do did does so "
    "as by from what when where who whom how why which can could would should will have has had "
    "am if then than there here about into".split()
)
#: The usual RRF constant (Cormack et al., 2009).
RRF_K = 60


def tokenize(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP]


class BM25:
    """Okapi BM25 over a fixed list of documents."""

    def __init__(self, docs: Sequence[str], k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.tfs = [Counter(tokenize(d)) for d in docs]
        self.lens = np.array([sum(tf.values()) for tf in self.tfs], dtype=np.float64)
        self.avgdl = float(self.lens.mean()) if len(docs) else 0.0
        df: Counter[str] = Counter()
        for tf in self.tfs:
            df.update(tf.keys())
        n = len(docs)
        self.idf = {t: math.log(1.0 + (n - c + 0.5) / (c + 0.5)) for t, c in df.items()}
        self.postings: dict[str, list[int]] = {}
        for i, tf in enumerate(self.tfs):
            for t in tf:
                self.postings.setdefault(t, []).append(i)

    def scores(self, query: str) -> np.ndarray:
        out = np.zeros(len(self.tfs), dtype=np.float64)
        if not self.tfs:
            return out
        for term in set(tokenize(query)):
            idf = self.idf.get(term)
            if idf is None:
                continue
            for i in self.postings[term]:
                f = self.tfs[i][term]
                norm = self.k1 * (1 - self.b + self.b * self.lens[i] / (self.avgdl or 1.0))
                out[i] += idf * f * (self.k1 + 1) / (f + norm)
        return out


def rank_by(scores: np.ndarray, positive_only: bool = False) -> list[int]:
    """Indices by descending score (ties by index); optionally only those scoring above zero."""
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    if positive_only:
        order = [i for i in order if scores[i] > 0]
    return order


def rrf(rankings: Sequence[Sequence[int]], k: int = RRF_K) -> list[int]:
    """Reciprocal-rank fusion of several rankings of the same items."""
    fused: dict[int, float] = {}
    for ranking in rankings:
        for r, i in enumerate(ranking):
            fused[i] = fused.get(i, 0.0) + 1.0 / (k + r + 1)
    return sorted(fused, key=lambda i: (-fused[i], i))


@dataclass(frozen=True)
class Packed:
    """What a baseline hands the model: the context text, its token count, the units in it."""

    text: str
    tokens: int
    units: tuple[int, ...]


def pack(
    ranking: Sequence[int],
    blocks: Sequence[str],
    block_tokens: Sequence[int],
    budget: int,
    count: Callable[[str], int],
    chronological: bool = True,
) -> Packed:
    """Fill ``budget`` tokens with blocks in rank order (first fit: a block too big is skipped).

    The chosen blocks are joined by blank lines, in time order when ``chronological`` (how a
    prompt would show them). The final text is counted again and trimmed from the lowest rank
    until it fits, so the result never exceeds the budget whatever the separators cost.
    """
    chosen: list[int] = []
    used = 0
    for i in ranking:
        cost = block_tokens[i] + (1 if chosen else 0)  # "\n\n" is one cl100k token
        if used + cost <= budget:
            chosen.append(i)
            used += cost
        if budget - used < 8:
            break
    while True:
        order = sorted(chosen) if chronological else list(chosen)
        text = "\n\n".join(blocks[i] for i in order)
        tokens = count(text)
        if tokens <= budget or not chosen:
            return Packed(text, tokens, tuple(order))
        chosen.pop()


class FlatIndex:
    """The baselines over one conversation's units: recency, BM25, dense and hybrid RRF."""

    SYSTEMS = ("recency", "bm25", "dense", "hybrid")

    def __init__(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        self.texts = list(texts)
        self.vectors = vectors
        self.bm25 = BM25(self.texts)

    def rankings(self, query: str, query_vec: np.ndarray) -> dict[str, list[int]]:
        n = len(self.texts)
        bm25 = rank_by(self.bm25.scores(query), positive_only=True)
        dense = rank_by(self.vectors @ query_vec) if n else []
        return {
            "recency": list(range(n - 1, -1, -1)),
            "bm25": bm25,
            "dense": dense,
            "hybrid": rrf([bm25, dense]),
        }
