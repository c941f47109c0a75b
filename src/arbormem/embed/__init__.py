"""Embedders: the contract, the bundled local model, and deterministic test embedders."""

from __future__ import annotations

from .base import CallableEmbedder, Embedder, check_vectors

__all__ = ["Embedder", "CallableEmbedder", "check_vectors", "make_embedder"]


def make_embedder(spec: str | Embedder | None, *, threads: int = 1, batch_size: int = 64) -> Embedder:
    """Build an embedder from a spec: an Embedder, "local", "hash", "openai:MODEL@URL" or a model folder."""
    if isinstance(spec, Embedder):
        return spec
    if spec is None or spec == "local":
        from .local import LocalEmbedder

        return LocalEmbedder(threads=threads, batch_size=batch_size)
    if spec.startswith("openai:"):  # "openai:MODEL@BASE_URL"
        from .openai import OpenAIEmbedder

        model, _, url = spec[7:].partition("@")
        return OpenAIEmbedder(url, model)
    if spec == "hash" or spec.startswith("hash:"):
        from .testing import HashEmbedder

        dim = int(spec.split(":", 1)[1]) if ":" in spec else 256
        return HashEmbedder(dim)
    from .local import LocalEmbedder

    return LocalEmbedder(spec, threads=threads, batch_size=batch_size)
