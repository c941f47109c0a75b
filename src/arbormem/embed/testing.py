"""Deterministic embedders for fast tests and examples (no model, no randomness).

``HashEmbedder`` hashes word unigrams and bigrams into a fixed-size vector, so texts that share
words are similar and unrelated texts are nearly orthogonal, the property placement and
retrieval rely on. It is a real embedder (not a mock): tests exercise the same code paths.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence

import numpy as np

from .base import Embedder

_WORD = re.compile(r"\w+", re.UNICODE)
_STOP = frozenset(
    "a an the and or but of to in on at for with is are was were be been it this that i you he "
    "she we they my your our their me him her us them do did does so just very too not no yes "
    "what when where who how why which can could would should will have has had am".split()
)


class HashEmbedder(Embedder):
    """Bag of hashed words and bigrams, L2-normalised; deterministic across processes."""

    def __init__(self, dim: int = 256) -> None:
        self._dim = dim
        self.name = f"hash-{dim}"
        self.calls = 0

    @property
    def dim(self) -> int:
        return self._dim

    def _bucket(self, token: str) -> tuple[int, float]:
        h = hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest()
        n = int.from_bytes(h, "little")
        return n % self._dim, (1.0 if (n >> 63) & 1 else -1.0)

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for i, text in enumerate(texts):
            words = [w for w in _WORD.findall(text.lower()) if w not in _STOP]
            for w in words:
                j, s = self._bucket(w)
                out[i, j] += s
            for a, b in zip(words, words[1:], strict=False):
                j, s = self._bucket(a + " " + b)
                out[i, j] += 0.5 * s
            # Keep every text non-zero so normalisation is defined.
            j, s = self._bucket("\x00bias")
            out[i, j] += 0.05 * s
        return out


class BrokenEmbedder(Embedder):
    """Returns a chosen kind of garbage, to prove arbormem rejects it before storing."""

    def __init__(self, mode: str = "nan", dim: int = 16) -> None:
        self.mode = mode
        self._dim = dim
        self.name = f"broken-{mode}"

    @property
    def dim(self) -> int:
        return self._dim

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        n = len(texts)
        if self.mode == "nan":
            return np.full((n, self._dim), np.nan, dtype=np.float32)
        if self.mode == "inf":
            return np.full((n, self._dim), np.inf, dtype=np.float32)
        if self.mode == "shape":
            return np.ones((n, self._dim + 1), dtype=np.float32)
        if self.mode == "zero":
            return np.zeros((n, self._dim), dtype=np.float32)
        raise RuntimeError("embedder backend exploded")


class FlakyEmbedder(HashEmbedder):
    """The hash embedder (same vectors, same recorded model) failing on chosen calls: an
    embedding server that goes down in the middle of a bulk import. ``fail_on`` holds the
    1-based numbers of the ``embed_batch`` calls that raise."""

    def __init__(self, fail_on: Iterable[int] = (3,), dim: int = 256) -> None:
        super().__init__(dim)
        self.fail_on = frozenset(fail_on)

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        if self.calls + 1 in self.fail_on:
            self.calls += 1
            raise RuntimeError(f"embedding server unavailable (call {self.calls})")
        return super().embed_batch(texts)
