from __future__ import annotations

import numpy as np

from arbormem.embed.testing import HashEmbedder
from arbormem.eval.baselines import BM25, FlatIndex, pack, rank_by, rrf
from arbormem.eval.runner import count_tokens

DOCS = [
    "We planted tomatoes and basil in the raised bed.",
    "The marathon training plan has intervals on Tuesday.",
    "Tomatoes need more water when the weather is hot; tomatoes love sun.",
    "My sister adopted a greyhound.",
]


def test_bm25_prefers_matching_and_rarer_terms() -> None:
    bm = BM25(DOCS)
    scores = bm.scores("tomatoes")
    assert rank_by(scores, positive_only=True) == [2, 0]  # two mentions beat one
    # "greyhound" appears once in the corpus, "tomatoes" twice: the rarer term weighs more
    assert bm.idf["greyhound"] > bm.idf["tomatoes"]
    assert bm.scores("stopwords the and of").sum() == 0.0


def test_rrf_rewards_agreement() -> None:
    fused = rrf([[0, 1, 2], [1, 0, 3]])
    assert set(fused[:2]) == {0, 1}
    assert fused.index(2) < len(fused) and 3 in fused
    # 1 is first in one list and second in the other, same as 0: ties break by index
    assert fused[:2] == [0, 1]


def test_pack_stays_within_budget_first_fit_and_chronological() -> None:
    blocks = ["alpha " * 50, "beta " * 5, "gamma " * 5, "delta " * 5]
    toks = [count_tokens(b) for b in blocks]
    budget = toks[1] + toks[3] + 5
    p = pack([0, 3, 1, 2], blocks, toks, budget, count_tokens)
    # block 0 is too big and is skipped; 3 then 1 fit; shown in time order
    assert p.units == (1, 3)
    assert p.tokens == count_tokens(p.text) <= budget
    assert pack([0], blocks, toks, 3, count_tokens).units == ()


def test_flat_index_rankings() -> None:
    emb = HashEmbedder(256)
    idx = FlatIndex(DOCS, emb.embed(DOCS))
    r = idx.rankings("when did my sister adopt a greyhound", emb.embed_one("sister adopted greyhound"))
    assert r["recency"] == [3, 2, 1, 0]
    assert r["bm25"][0] == 3
    assert r["dense"][0] == 3
    assert r["hybrid"][0] == 3
    assert sorted(r["dense"]) == [0, 1, 2, 3]
    assert isinstance(idx.vectors, np.ndarray)
