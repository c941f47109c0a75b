"""Fixtures of the LLM tests: a real scripted OpenAI-compatible server on loopback."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# tests/support is shared test code, not a test package; make it importable from here.
_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from arbormem.llm import LLMRunner, OpenAICompatibleLLM  # noqa: E402
from support.openai_server import ScriptedOpenAIServer  # noqa: E402

API_KEY = "sk-test-5f3a9c-secret"


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
