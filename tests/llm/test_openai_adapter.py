"""OpenAICompatibleLLM against a real HTTP server: requests, retries, timeouts, secrets."""

from __future__ import annotations

import threading
import time

import pytest

from arbormem.config import LLMSettings, Settings
from arbormem.errors import ConfigError, LLMError
from arbormem.llm import ChatMessage, LLMRunner, OpenAICompatibleLLM, make_runner
from arbormem.llm.openai import LLMReplyError
from tests.support.openai_server import (
    API_KEY,
    ScriptedOpenAIServer,
    answer,
    empty,
    garbage_body,
    http_error,
    refusal,
    slow,
    truncated,
)

HELLO = [ChatMessage("system", "be brief"), ChatMessage("user", "hello")]


def test_sends_an_openai_chat_request(server: ScriptedOpenAIServer, llm: OpenAICompatibleLLM) -> None:
    server.script(answer("hi there"))
    assert llm.chat(HELLO, max_tokens=77, json_mode=True) == "hi there"
    (req,) = server.chat_requests
    assert req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == f"Bearer {API_KEY}"
    assert req.body["model"] == "test-model"
    assert req.body["max_tokens"] == 77
    assert req.body["temperature"] == 0.0
    assert req.body["response_format"] == {"type": "json_object"}
    assert req.body["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]


def test_model_override_per_call(server: ScriptedOpenAIServer, llm: OpenAICompatibleLLM) -> None:
    server.script(answer("a"))
    llm.chat(HELLO, model="small-model")
    assert server.chat_requests[0].body["model"] == "small-model"
    assert "response_format" not in server.chat_requests[0].body


@pytest.mark.parametrize("status", [500, 502, 503, 429, 408])
def test_transient_errors_are_retried(server: ScriptedOpenAIServer, llm: OpenAICompatibleLLM, status: int) -> None:
    server.script(http_error(status, retry_after=0), answer("recovered"))
    assert llm.chat(HELLO) == "recovered"
    assert len(server.chat_requests) == 2


def test_retries_are_bounded(server: ScriptedOpenAIServer, llm: OpenAICompatibleLLM) -> None:
    server.script(*[http_error(500)] * 5)
    with pytest.raises(LLMError, match="HTTP 500"):
        llm.chat(HELLO)
    assert len(server.chat_requests) == 3  # 1 + max_retries=2
    assert server.pending == 2


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_client_errors_fail_at_once(server: ScriptedOpenAIServer, llm: OpenAICompatibleLLM, status: int) -> None:
    server.script(http_error(status), answer("never"))
    with pytest.raises(LLMError, match=f"HTTP {status}"):
        llm.chat(HELLO)
    assert len(server.chat_requests) == 1


def test_backoff_grows_and_honours_retry_after(server: ScriptedOpenAIServer) -> None:
    client = OpenAICompatibleLLM(server.url, "m", timeout=2, max_retries=1, backoff=0.01)
    server.script(http_error(429, retry_after=0.4), answer("ok"))
    t0 = time.perf_counter()
    assert client.chat(HELLO) == "ok"
    assert time.perf_counter() - t0 >= 0.4


def test_server_without_json_mode_gets_plain_requests(server: ScriptedOpenAIServer, llm: OpenAICompatibleLLM) -> None:
    # LM Studio answers 400 to response_format json_object.
    server.script(http_error(400, message="'response_format.type' must be 'json_schema' or 'text'"),
                  answer("first"), answer("second"))
    assert llm.chat(HELLO, json_mode=True) == "first"
    assert llm.chat(HELLO, json_mode=True) == "second"
    bodies = [r.body for r in server.chat_requests]
    assert "response_format" in bodies[0]
    assert "response_format" not in bodies[1] and "response_format" not in bodies[2]


def test_timeout_is_enforced_and_raised_as_llm_error(server: ScriptedOpenAIServer) -> None:
    client = OpenAICompatibleLLM(server.url, "m", timeout=0.3, max_retries=0)
    server.script(slow(5, answer("too late")))
    t0 = time.perf_counter()
    with pytest.raises(LLMError, match="Timeout"):
        client.chat(HELLO)
    assert time.perf_counter() - t0 < 2.0


def test_per_call_timeout_overrides_default(server: ScriptedOpenAIServer) -> None:
    client = OpenAICompatibleLLM(server.url, "m", timeout=10, max_retries=0)
    server.script(slow(5, answer("too late")))
    t0 = time.perf_counter()
    with pytest.raises(LLMError):
        client.chat(HELLO, timeout=0.3)
    assert time.perf_counter() - t0 < 2.0


def test_slow_but_in_time_answers_arrive(server: ScriptedOpenAIServer, llm: OpenAICompatibleLLM) -> None:
    server.script(slow(0.3, answer("worth the wait")))
    assert llm.chat(HELLO) == "worth the wait"


@pytest.mark.parametrize(
    "behaviour, match",
    [
        (refusal(), "refused"),
        (truncated({"title": "a" * 50}, finish_reason="length"), "cut at max_tokens"),
        (empty(), "empty"),
    ],
    ids=["refusal", "length", "empty"],
)
def test_unusable_replies_raise_reply_errors(server: ScriptedOpenAIServer, llm: OpenAICompatibleLLM, behaviour, match) -> None:
    server.script(behaviour)
    with pytest.raises(LLMReplyError, match=match):
        llm.chat(HELLO)
    assert len(server.chat_requests) == 1  # a bad answer is not retried


def test_non_json_body_is_an_llm_error(server: ScriptedOpenAIServer, llm: OpenAICompatibleLLM) -> None:
    server.script(garbage_body())
    with pytest.raises(LLMError):
        llm.chat(HELLO)


def test_unreachable_server_is_an_llm_error() -> None:
    with ScriptedOpenAIServer() as srv:
        url = srv.url
    client = OpenAICompatibleLLM(url, "m", timeout=1, max_retries=1, backoff=0.01)
    with pytest.raises(LLMError, match="Connection"):
        client.chat(HELLO)


def test_concurrency_is_limited(server: ScriptedOpenAIServer) -> None:
    client = OpenAICompatibleLLM(server.url, "m", timeout=5, max_retries=0, concurrency=2)
    server.script(*[slow(0.25, answer("x"))] * 6)
    threads = [threading.Thread(target=client.chat, args=(HELLO,)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(server.chat_requests) == 6
    assert server.max_in_flight == 2


def test_api_key_never_appears_in_names_or_errors(server: ScriptedOpenAIServer, llm: OpenAICompatibleLLM) -> None:
    # A proxy that echoes the Authorization header back into its error message.
    server.script(http_error(401, message=f"bad key Bearer {API_KEY}"))
    runner = LLMRunner(llm)
    from arbormem.llm.prompts import Turn
    from arbormem.llm.roles import label_topic

    assert label_topic(runner, [Turn(1, "q", "a")]) is None
    call = runner.log()[-1]
    assert call.error and "401" in call.error
    for text in (llm.name, repr(llm), call.error, str(call.to_dict())):
        assert API_KEY not in text


def test_name_hides_url_credentials() -> None:
    client = OpenAICompatibleLLM("https://user:pw@example.org:8443/v1?key=abc", "m")
    assert client.name == "openai-compatible:m@example.org:8443/v1"


def test_settings_and_environment(server: ScriptedOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARBORMEM_LLM__BASE_URL", server.url)
    monkeypatch.setenv("ARBORMEM_LLM__MODEL", "env-model")
    monkeypatch.setenv("ARBORMEM_LLM__API_KEY", "sk-env")
    runner = make_runner(None, Settings().llm)
    assert runner is not None
    server.script(answer("{}"))
    runner.llm.chat(HELLO)
    req = server.chat_requests[0]
    assert req.body["model"] == "env-model" and req.headers["authorization"] == "Bearer sk-env"
    assert "sk-env" not in repr(Settings().llm)


def test_no_settings_means_offline() -> None:
    assert make_runner(None, LLMSettings()) is None
    assert make_runner(None, LLMSettings(base_url="http://x/v1")) is None  # no model


def test_bad_configuration_is_rejected() -> None:
    with pytest.raises(ConfigError):
        OpenAICompatibleLLM("", "m")
    with pytest.raises(ConfigError):
        OpenAICompatibleLLM("http://localhost/v1", "")
    with pytest.raises(ConfigError):
        OpenAICompatibleLLM("http://localhost/v1", "m", concurrency=0)
    with pytest.raises(ConfigError):
        make_runner("gpt-4o")  # type: ignore[arg-type]


def test_reasoning_model_parameters_are_adapted(server: ScriptedOpenAIServer, llm: OpenAICompatibleLLM) -> None:
    server.script(
        http_error(400, message="Unsupported parameter: 'max_tokens' is not supported with this model. "
                                "Use 'max_completion_tokens' instead."),
        http_error(400, message="Unsupported value: 'temperature' does not support 0.0 with this model."),
        answer("adapted"), answer("still adapted"),
    )
    assert llm.chat(HELLO, max_tokens=50, json_mode=True) == "adapted"
    assert llm.chat(HELLO, max_tokens=60, json_mode=True) == "still adapted"
    first, second, third, fourth = (r.body for r in server.chat_requests)
    assert first["max_tokens"] == 50 and "max_completion_tokens" not in first
    assert second["max_completion_tokens"] == 50 and "max_tokens" not in second and "temperature" in second
    assert "temperature" not in third and third["response_format"] == {"type": "json_object"}
    assert fourth["max_completion_tokens"] == 60 and "temperature" not in fourth


def test_an_unrelated_bad_request_is_not_retried_forever(server: ScriptedOpenAIServer, llm: OpenAICompatibleLLM) -> None:
    server.script(*[http_error(400, message="model not loaded")] * 5)
    with pytest.raises(LLMError, match="HTTP 400"):
        llm.chat(HELLO, json_mode=True)
    assert len(server.chat_requests) == 2  # once with JSON mode, once without, then give up
