"""An ``Embedder`` for any OpenAI-compatible ``/v1/embeddings`` endpoint.

OpenAI, LM Studio, Ollama (``/v1``), vLLM and NIM all serve this route. Requests are batched
(``batch_size`` texts each) and go through the same transport as the chat adapter: bounded
retries with backoff, a concurrency limit, an API key that never appears in names, reprs or
errors. ``Embedder.embed`` validates what comes back (NaN, inf, wrong size, zero rows), so a
misbehaving server raises ``EmbeddingError`` instead of writing garbage vectors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError, EmbeddingError, LLMError
from ..llm.openai import OpenAIEndpoint, safe_endpoint
from .base import Embedder


class OpenAIEmbedder(Embedder):
    """Embeddings over HTTP.

    ``dim`` is the vector size; when omitted it is learnt from one probe request the first
    time it is needed (never at construction). ``dimensions`` is sent to servers that can
    shorten vectors (OpenAI's text-embedding-3 models); leave it None for the others.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        dim: int | None = None,
        dimensions: int | None = None,
        batch_size: int = 64,
        timeout: float = 30.0,
        max_retries: int = 2,
        concurrency: int = 4,
        backoff: float = 0.5,
    ) -> None:
        if not model:
            raise ConfigError("an OpenAI-compatible embedder needs a model name")
        if batch_size < 1:
            raise ConfigError("batch_size must be >= 1")
        if dim is not None and dimensions is not None and dim != dimensions:
            raise ConfigError("dim and dimensions disagree")
        self.model = model
        self.batch_size = batch_size
        self.dimensions = dimensions
        self._dim = dim if dim is not None else dimensions
        self.endpoint = OpenAIEndpoint(
            base_url,
            api_key=api_key,
            timeout=timeout,
            max_retries=max_retries,
            concurrency=concurrency,
            backoff=backoff,
        )
        # The name is stored with the memory; vectors of another model or size never mix.
        suffix = f":{dimensions}" if dimensions else ""
        self.name = f"openai:{model}{suffix}@{safe_endpoint(base_url)}"
        self.requests = 0

    def __repr__(self) -> str:
        return f"OpenAIEmbedder({self.name!r})"

    @property
    def dim(self) -> int:
        if self._dim is None:
            probe = self._request(["dimension probe"])
            if probe.ndim != 2 or probe.shape[0] != 1 or probe.shape[1] < 1:
                raise EmbeddingError(f"{self.name}: cannot learn the vector size (got {probe.shape})")
            self._dim = int(probe.shape[1])
        return self._dim

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        parts = [self._request(texts[i : i + self.batch_size]) for i in range(0, len(texts), self.batch_size)]
        widths = {p.shape[1] for p in parts if p.ndim == 2}
        if len(widths) > 1:
            raise EmbeddingError(f"{self.name}: batches came back with different sizes {sorted(widths)}")
        return np.concatenate(parts, axis=0) if parts else np.zeros((0, self.dim), dtype=np.float32)

    def _request(self, batch: list[str]) -> np.ndarray:
        kwargs: dict[str, Any] = {"model": self.model, "input": batch, "encoding_format": "float"}
        if self.dimensions is not None:
            kwargs["dimensions"] = self.dimensions
        try:
            resp = self.endpoint.call("embeddings", lambda: self.endpoint.client.embeddings.create(**kwargs))
        except LLMError as exc:
            raise EmbeddingError(f"{self.name}: {exc}") from exc
        self.requests += 1
        data = list(getattr(resp, "data", None) or [])
        if len(data) != len(batch):
            raise EmbeddingError(f"{self.name}: asked for {len(batch)} vectors, got {len(data)}")
        # Servers may return rows out of order; ``index`` says which input each belongs to.
        rows = sorted(data, key=lambda d: d.index)
        if [d.index for d in rows] != list(range(len(batch))):
            raise EmbeddingError(f"{self.name}: the reply's indexes do not match the inputs")
        try:
            return np.asarray([d.embedding for d in rows], dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise EmbeddingError(f"{self.name}: vectors are ragged or not numeric") from exc

    def close(self) -> None:
        self.endpoint.close()


__all__ = ["OpenAIEmbedder"]
