"""OpenAIEmbedder against the scripted server: batching, order, validation, failures."""

from __future__ import annotations

import math

import numpy as np
import pytest

from arbormem.embed.openai import OpenAIEmbedder
from arbormem.errors import ConfigError, EmbeddingError
from tests.support.openai_server import (
    API_KEY,
    Behaviour,
    ScriptedOpenAIServer,
    hash_vectors,
    http_error,
    vectors,
)


def make(server: ScriptedOpenAIServer, **kw: object) -> OpenAIEmbedder:
    opts: dict = {"api_key": API_KEY, "dim": 16, "batch_size": 2, "timeout": 2, "max_retries": 1, "backoff": 0.01}
    opts.update(kw)
    return OpenAIEmbedder(server.url, "embed-model", **opts)


def test_batches_and_unit_rows(server: ScriptedOpenAIServer) -> None:
    emb = make(server)
    texts = ["one", "two", "three", "four", "five"]
    out = emb.embed(texts)
    assert out.shape == (5, 16) and out.dtype == np.float32
    assert np.allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    reqs = server.embedding_requests
    assert [r.body["input"] for r in reqs] == [["one", "two"], ["three", "four"], ["five"]]
    assert all(r.body["model"] == "embed-model" and r.body["encoding_format"] == "float" for r in reqs)
    assert reqs[0].headers["authorization"] == f"Bearer {API_KEY}"
    expected = np.asarray(hash_vectors(16)(texts), dtype=np.float32)
    assert np.allclose(out, expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=1e-5)


def test_rows_are_put_back_in_input_order(server: ScriptedOpenAIServer) -> None:
    emb = make(server, batch_size=8)
    server.script_embeddings(Behaviour(reverse=True, label="reversed"))
    out = emb.embed(["a", "b", "c"])
    expected = np.asarray(hash_vectors(16)(["a", "b", "c"]), dtype=np.float32)
    assert np.allclose(out, expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=1e-5)


def test_dim_is_probed_lazily(server: ScriptedOpenAIServer) -> None:
    emb = make(server, dim=None)
    assert server.embedding_requests == []  # nothing at construction
    assert emb.dim == 16
    assert len(server.embedding_requests) == 1
    assert emb.dim == 16 and len(server.embedding_requests) == 1


@pytest.mark.parametrize(
    "fn, match",
    [
        (lambda texts: [[math.nan] * 16 for _ in texts], "NaN or inf"),
        (lambda texts: [[math.inf] * 16 for _ in texts], "NaN or inf"),
        (lambda texts: [[0.1] * 12 for _ in texts], "shape"),
        (lambda texts: [[0.0] * 16 for _ in texts], "zero vector"),
        (lambda texts: [[0.1] * 16 for _ in texts[:-1]], "got 1"),
        (lambda texts: [[0.1] * 16, [0.1] * 8][: len(texts)], "ragged"),
    ],
    ids=["nan", "inf", "wrong-dim", "zero", "missing-row", "ragged"],
)
def test_broken_vectors_are_rejected(server: ScriptedOpenAIServer, fn, match: str) -> None:
    emb = make(server)
    server.script_embeddings(vectors(fn))
    with pytest.raises(EmbeddingError, match=match):
        emb.embed(["a", "b"])


def test_http_failures_become_embedding_errors(server: ScriptedOpenAIServer) -> None:
    emb = make(server)
    server.script_embeddings(http_error(500), http_error(500))
    with pytest.raises(EmbeddingError, match="HTTP 500"):
        emb.embed(["a"])
    assert len(server.embedding_requests) == 2  # one retry


def test_transient_failure_is_retried(server: ScriptedOpenAIServer) -> None:
    emb = make(server)
    server.script_embeddings(http_error(503))
    assert emb.embed(["a"]).shape == (1, 16)


def test_name_identifies_model_without_secrets(server: ScriptedOpenAIServer) -> None:
    emb = make(server, dim=None, dimensions=16)
    assert emb.name.startswith("openai:embed-model:16@127.0.0.1:")
    assert API_KEY not in emb.name + repr(emb)
    emb.embed(["a"])
    assert server.embedding_requests[-1].body["dimensions"] == 16


def test_bad_configuration() -> None:
    with pytest.raises(ConfigError):
        OpenAIEmbedder("http://localhost/v1", "")
    with pytest.raises(ConfigError):
        OpenAIEmbedder("http://localhost/v1", "m", batch_size=0)
    with pytest.raises(ConfigError):
        OpenAIEmbedder("http://localhost/v1", "m", dim=8, dimensions=16)
