"""Which candidate title sits nearest a theme: the memory's embedder asked about short phrases.

A theme's offline title is the best-scored phrase its children share (``labels.theme_title``).
Counts alone favour a recurring side detail over the subject: "South coast" over "Iceland",
"Battery" over "Solar panels", "Chapter" over "Thesis", because a detail that two visits
repeat as a fixed phrase outscores the subject's one word. KeyBERT's idea settles it: embed
the few best candidates with the same model as the exchanges and prefer the one nearest the
theme's centroid (docs/titles.md, "Nearest phrase"). Only embedders that embed a short
phrase meaningfully take part (``Embedder.names_phrases``: the local sentence model, not the
test hash embedder, and not a remote API that would be called inside the write lock).

The vectors are cached: a theme is retitled with mostly the same candidates as it grows. A
failing embedder returns no closeness, so titling keeps its offline pick and nothing
waits for or stores a bad vector.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import numpy as np

from ..config import TreeSettings
from ..embed.base import Embedder
from ..errors import EmbeddingError

log = logging.getLogger(__name__)

#: Cached phrase vectors (384 floats each for MiniLM: ~6 MB at the cap).
CACHE = 4096


class PhraseVectors:
    """Unit vectors of candidate titles from one embedder, with a bounded cache. Shared by
    the units of work of one memory (placement may run in a background worker), so the
    cache is guarded by a lock; the embedder is called outside it."""

    def __init__(self, embedder: Embedder, cache: int = CACHE) -> None:
        self.embedder = embedder
        self._cap = max(1, cache)
        self._vecs: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def closeness(self, texts: Sequence[str], centroid: np.ndarray) -> list[float] | None:
        """Cosine of each text to ``centroid`` (a unit vector); None when the embedder fails
        (the caller keeps its offline choice)."""
        with self._lock:
            # This call's own copy of what it needs: another thread may reset the cache
            # while the embedder runs.
            vecs = {t: v for t in texts if (v := self._vecs.get(t)) is not None}
        missing = [t for t in dict.fromkeys(texts) if t not in vecs]
        if missing:
            try:
                got = self.embedder.embed(missing)
            except EmbeddingError as exc:
                log.warning("title vectors unavailable, keeping offline titles: %s", exc)
                return None
            fresh = dict(zip(missing, got, strict=True))
            vecs.update(fresh)
            with self._lock:
                if len(self._vecs) + len(fresh) > self._cap:
                    self._vecs.clear()  # phrases recur by theme; a full reset is simplest
                self._vecs.update(fresh)
        return [float(vecs[t] @ centroid) for t in texts]


def phrase_vectors(embedder: Embedder, settings: TreeSettings) -> PhraseVectors | None:
    """The titling aid for this embedder, or None (offline titles only)."""
    if settings.title_vectors and embedder.names_phrases:
        return PhraseVectors(embedder)
    return None


__all__ = ["CACHE", "PhraseVectors", "phrase_vectors"]
