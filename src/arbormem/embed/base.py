"""The Embedder contract: one method, plus the vector size.

An embedder turns a batch of texts into a float32 matrix of unit-length rows. arbormem checks
every batch it gets back (``check_vectors``) so a broken embedder can never write NaN, inf or
wrong-sized vectors into the store.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import numpy as np

from ..errors import EmbeddingError


class Embedder(ABC):
    """Turns texts into vectors. Implement ``embed_batch`` and ``dim``."""

    #: Identifies the model; stored with the memory so vectors of different models never mix.
    name: str = "embedder"
    #: The relevance floor calibrated for this model's cosines (docs/recall.md, "Relevance
    #: floor"; scripts/calibrate_relevance.py), used when ``min_relevance`` is not set. None:
    #: not calibrated, so recall fills the budget unless a floor is given.
    relevance_floor: float | None = None
    #: The topic-shift head trained on this model's vectors (``organize/shift.py``: the file
    #: ``data/shift_<name>.json``), used by placement. None: placement's plain link rule.
    shift_head: str | None = None
    #: Capability: one call costs about its longest text times its size (a local transformer
    #: pads every text of a batch to the longest). Callers embedding small unsorted batches
    #: (background placement, ``backlog.py``) then split them by length first; a remote
    #: embedder is better served by fewer, larger requests.
    pads_batches: bool = False
    #: Capability: the model embeds a two-word phrase as meaningfully as a sentence (a local
    #: sentence model), so titling may ask which candidate phrase sits nearest a theme
    #: (``organize/title_vectors.py``). Off for bag-of-words test embedders and for remote
    #: ones (a request per retitled theme, inside the write lock).
    names_phrases: bool = False

    @property
    @abstractmethod
    def dim(self) -> int:
        """Vector size."""

    @abstractmethod
    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts; return a (len(texts), dim) array."""

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed and validate: float32, finite, right shape, rows normalised to unit length."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        try:
            raw = self.embed_batch(list(texts))
        except EmbeddingError:
            raise
        except Exception as exc:  # any failure of a third-party model is an EmbeddingError
            raise EmbeddingError(f"{self.name}: embedding failed: {exc}") from exc
        return check_vectors(raw, len(texts), self.dim, self.name)

    @property
    def spec(self) -> str:
        """``NAME:DIM``, as a memory records the embedder its vectors were made with."""
        return f"{self.name}:{self.dim}"

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]


def check_vectors(raw: object, n: int, dim: int, name: str = "embedder") -> np.ndarray:
    """Validate an embedder's output and normalise rows; raise EmbeddingError if unusable."""
    try:
        arr = np.asarray(raw, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise EmbeddingError(f"{name}: output is not numeric: {exc}") from exc
    if arr.ndim != 2 or arr.shape != (n, dim):
        raise EmbeddingError(f"{name}: expected shape ({n}, {dim}), got {arr.shape}")
    if not np.isfinite(arr).all():
        raise EmbeddingError(f"{name}: output contains NaN or inf")
    # Normalised in float64: squaring float32 values of 1e20 overflows to inf, and dividing by
    # an infinite norm stored an all-zero vector.
    wide = arr.astype(np.float64)
    norms = np.linalg.norm(wide, axis=1, keepdims=True)
    if not (np.isfinite(norms).all() and (norms > 0).all()):
        raise EmbeddingError(f"{name}: output contains a zero vector")
    unit = (wide / norms).astype(np.float32)
    if not (unit.any(axis=1).all() and np.isfinite(unit).all()):
        raise EmbeddingError(f"{name}: output contains a vector that is zero in float32")
    return unit


class CallableEmbedder(Embedder):
    """Wraps a plain function ``texts -> vectors``."""

    def __init__(self, fn: Callable[[list[str]], object], dim: int, name: str = "callable") -> None:
        self._fn = fn
        self._dim = dim
        self.name = name

    @property
    def dim(self) -> int:
        return self._dim

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self._fn(list(texts)), dtype=np.float32)
