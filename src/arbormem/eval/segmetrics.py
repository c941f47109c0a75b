"""Topic-segmentation metrics and the unsupervised baselines ``arbormem eval topics`` runs.

Labels are per utterance (or per exchange): two positions share a label when they sit in the
same segment (or leaf). All metrics take gold and predicted label sequences of one dialogue.

* **Pk** (Beeferman et al. 1999) and **WindowDiff** (Pevzner & Hearst 2002): slide a window of
  ``k`` positions, k = half the mean gold segment length (rounded, at least 2 as is usual);
  Pk counts windows where gold and prediction disagree on "same segment", WindowDiff windows
  where they disagree on the number of boundaries inside. Lower is better.
* **Boundary F1**: exact boundary positions.
* **Homogeneity / completeness / V-measure** (Rosenberg & Hirschberg 2007) of predicted
  labels against gold labels: a leaf that holds two gold segments loses homogeneity, a gold
  segment split over leaves loses completeness. Labels need not be contiguous, so a leaf that
  a returning subject rejoins is scored as one cluster.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence

import numpy as np


def labels_from_segments(segments: Sequence[int]) -> list[int]:
    out: list[int] = []
    for i, n in enumerate(segments):
        out.extend([i] * n)
    return out


def boundaries(labels: Sequence[object]) -> list[int]:
    """1 at position i when labels i-1 and i differ (i >= 1), as a 0/1 list of len-1."""
    return [int(labels[i] != labels[i - 1]) for i in range(1, len(labels))]


def window_k(gold: Sequence[object]) -> int:
    segs = 1 + sum(boundaries(gold))
    return max(2, round(len(gold) / segs / 2))


def pk(gold: Sequence[object], pred: Sequence[object], k: int | None = None) -> float:
    n = len(gold)
    k = k or window_k(gold)
    if n <= k:
        return 0.0
    wrong = 0
    for i in range(n - k):
        wrong += (gold[i] == gold[i + k]) != (pred[i] == pred[i + k])
    return wrong / (n - k)


def window_diff(gold: Sequence[object], pred: Sequence[object], k: int | None = None) -> float:
    n = len(gold)
    k = k or window_k(gold)
    if n <= k:
        return 0.0
    gb, pb = boundaries(gold), boundaries(pred)
    wrong = 0
    for i in range(n - k):
        wrong += sum(gb[i:i + k]) != sum(pb[i:i + k])
    return wrong / (n - k)


def boundary_prf(gold: Sequence[object], pred: Sequence[object]) -> tuple[int, int, int]:
    """(true positives, predicted boundaries, gold boundaries)."""
    gb, pb = boundaries(gold), boundaries(pred)
    return sum(g and p for g, p in zip(gb, pb, strict=True)), sum(pb), sum(gb)


def _entropy(counts: Sequence[int], total: int) -> float:
    return -sum(c / total * math.log(c / total) for c in counts if c)


def v_measure(gold: Sequence[object], pred: Sequence[object]) -> tuple[float, float, float]:
    """(homogeneity, completeness, V-measure) of ``pred`` clusters against ``gold`` classes."""
    n = len(gold)
    if n == 0:
        return 1.0, 1.0, 1.0
    joint = Counter(zip(gold, pred, strict=True))
    cg, cp = Counter(gold), Counter(pred)
    h_c = _entropy(list(cg.values()), n)
    h_k = _entropy(list(cp.values()), n)
    h_c_k = -sum(c / n * math.log(c / cp[p]) for (_, p), c in joint.items())
    h_k_c = -sum(c / n * math.log(c / cg[g]) for (g, _), c in joint.items())
    hom = 1.0 if h_c == 0 else 1.0 - h_c_k / h_c
    com = 1.0 if h_k == 0 else 1.0 - h_k_c / h_k
    v = 0.0 if hom + com == 0 else 2 * hom * com / (hom + com)
    return hom, com, v


# -- baselines over exchange vectors ---------------------------------------------------------------
def texttiling(vecs: np.ndarray, window: int = 2) -> list[int]:
    """TextTiling (Hearst 1997) over unit vectors: gap scores are cosines of the mean vectors of
    ``window`` exchanges either side, depth scores from the peaks left and right, and a boundary
    wherever depth > mean - std/2 of the dialogue's depths (Hearst's cut-off). Returns a leaf
    label per exchange."""
    n = len(vecs)
    if n < 2:
        return [0] * n
    gaps = []
    for g in range(1, n):
        left = vecs[max(0, g - window):g].sum(axis=0)
        right = vecs[g:g + window].sum(axis=0)
        gaps.append(float(left @ right / ((np.linalg.norm(left) * np.linalg.norm(right)) or 1.0)))
    depth = []
    for i, s in enumerate(gaps):
        lp = s
        for j in range(i, -1, -1):
            if gaps[j] < lp:
                break
            lp = gaps[j]
        rp = s
        for j in range(i, len(gaps)):
            if gaps[j] < rp:
                break
            rp = gaps[j]
        depth.append((lp - s) + (rp - s))
    cut = float(np.mean(depth) - np.std(depth) / 2)
    labels, cur = [0], 0
    for i, d in enumerate(depth):
        # Only local minima of the gap score are boundaries (Hearst's "valleys").
        left_ok = i == 0 or gaps[i] <= gaps[i - 1]
        right_ok = i == len(gaps) - 1 or gaps[i] <= gaps[i + 1]
        if d > cut and d > 0 and left_ok and right_ok:
            cur += 1
        labels.append(cur)
    return labels


def random_labels(n: int, segments: int, rng: random.Random) -> list[int]:
    """``segments`` segments with boundaries at random gaps (the gold count: a chance baseline)."""
    cuts = set(rng.sample(range(1, n), min(n - 1, max(0, segments - 1)))) if n > 1 else set()
    labels, cur = [], 0
    for i in range(n):
        if i in cuts:
            cur += 1
        labels.append(cur)
    return labels
