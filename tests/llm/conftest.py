"""Fixtures of the LLM tests: a real scripted OpenAI-compatible server on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from arbormem.llm import LLMRunner, OpenAICompatibleLLM
from tests.support.openai_server import API_KEY, ScriptedOpenAIServer


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    """A fresh scripted server per test (a thread on 127.0.0.1, port 0)."""
    with ScriptedOpenAIServer() as srv:
        yield srv


@pytest.fixture
def llm(server: ScriptedOpenAIServer) -> Iterator[OpenAICompatibleLLM]:
    """The real adapter pointed at the server; fast backoff and short timeouts for tests."""
    client = OpenAICompatibleLLM(
        server.url, "test-model", api_key=API_KEY, timeout=2.0, max_retries=2, backoff=0.01
    )
    yield client
    client.close()


@pytest.fixture
def runner(llm: OpenAICompatibleLLM) -> LLMRunner:
    return LLMRunner(llm)
