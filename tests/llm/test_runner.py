"""LLMRunner: a typed result or None for every kind of answer, with a bounded log."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import pytest

from arbormem.llm import LLM, ChatMessage, LLMRunner, OpenAICompatibleLLM
from arbormem.llm.prompts import Turn
from arbormem.llm.roles import TopicLabel, label_topic
from tests.support.openai_server import (
    Behaviour,
    ScriptedOpenAIServer,
    answer,
    answer_json,
    chatty,
    empty,
    fenced,
    garbage_body,
    http_error,
    refusal,
    slow,
    truncated,
)

LABEL = {
    "title": "Sourdough starter care",
    "keywords": ["sourdough", "starter", "feeding"],
    "retrieval_terms": ["levain", "bread baking"],
    "trigger": "when the user bakes bread again",
    "summary": "The user feeds a rye starter twice a day at 100% hydration.",
}
TURNS = [Turn(1, "How often should I feed my rye starter?", "Twice a day at 100% hydration.")]


@pytest.mark.parametrize("behaviour", [answer_json(LABEL), fenced(LABEL), chatty(LABEL)], ids=["json", "fenced", "chatty"])
def test_good_answers_give_typed_results(server: ScriptedOpenAIServer, runner: LLMRunner, behaviour: Behaviour) -> None:
    server.script(behaviour)
    label = label_topic(runner, TURNS)
    assert isinstance(label, TopicLabel)
    assert label.title == LABEL["title"]
    assert label.trigger == LABEL["trigger"]
    (call,) = runner.log()
    assert call.ok and call.role == "labeler" and call.model == "test-model"
    assert call.input_chars > 0 and "Sourdough" in call.output


# Every way an answer can be bad: the role returns None, the log says why.
BAD = {
    "http-500": [http_error(500)] * 3,
    "http-429": [http_error(429, retry_after=0)] * 3,
    "http-400": [http_error(400)] * 2,
    "timeout": [slow(3, answer_json(LABEL))] * 3,
    "refusal-field": [refusal()],
    "refusal-text": [refusal(field_=False)],
    "truncated-length": [truncated(LABEL, 0.5, finish_reason="length")],
    "truncated-stop": [truncated(LABEL, 0.5, finish_reason="stop")],
    "wrong-schema": [answer_json({"name": "Sourdough", "tags": ["x"]})],
    "wrong-types": [answer_json({**LABEL, "keywords": "sourdough"})],
    "prose": [answer("This topic is about sourdough starters.")],
    "empty": [empty()],
    "garbage-body": [garbage_body()],
    "placeholder-echo": [answer_json({**LABEL, "title": "<title>"})],
    "two-answers": [answer(json.dumps(LABEL) + "\n" + json.dumps({**LABEL, "title": "Other"}))],
}


@pytest.mark.parametrize("kind", list(BAD))
def test_every_bad_answer_gives_none_and_is_logged(server: ScriptedOpenAIServer, kind: str) -> None:
    llm = OpenAICompatibleLLM(server.url, "test-model", timeout=0.4, max_retries=2, backoff=0.01)
    runner = LLMRunner(llm)
    server.script(*BAD[kind])
    result = label_topic(runner, TURNS)
    assert result is None
    (call,) = runner.log()
    assert not call.ok and call.error
    assert call.role == "labeler" and call.input_chars > 0
    assert runner.counts() == {"labeler": 1} and runner.failure_counts() == {"labeler": 1}
    assert runner.log(failures_only=True) == [call]
    if kind in ("refusal-field", "refusal-text", "prose", "truncated-stop", "wrong-schema"):
        assert call.output  # the raw answer is kept for inspection


class ExplodingLLM(LLM):
    """A real LLM implementation whose backend fails in ways the contract does not foresee."""

    name = "exploding"

    def __init__(self, exc: BaseException | None = None, reply: object = None) -> None:
        self.exc, self.reply = exc, reply

    def chat(self, messages: Sequence[ChatMessage], **kwargs: object) -> str:  # type: ignore[override]
        if self.exc is not None:
            raise self.exc
        return self.reply  # type: ignore[return-value]


@pytest.mark.parametrize(
    "llm",
    [ExplodingLLM(RuntimeError("backend exploded")), ExplodingLLM(KeyError("x")),
     ExplodingLLM(reply=None), ExplodingLLM(reply={"title": "x"})],
    ids=["runtime-error", "key-error", "none-reply", "dict-reply"],
)
def test_nothing_escapes_from_custom_llms(llm: LLM) -> None:
    runner = LLMRunner(llm)
    assert label_topic(runner, TURNS) is None
    assert runner.log()[-1].error


def test_error_text_is_never_returned_as_data() -> None:
    runner = LLMRunner(ExplodingLLM(RuntimeError("Error")))
    assert runner.run("labeler", [ChatMessage("user", "x")], TopicLabel) is None


def test_per_role_models(server: ScriptedOpenAIServer, llm: OpenAICompatibleLLM) -> None:
    runner = LLMRunner(llm, models={"labeler": "big-model"})
    server.script(answer_json(LABEL), answer("{}"))
    label_topic(runner, TURNS)
    runner.run("other", [ChatMessage("user", "x")], TopicLabel)
    assert [r.body["model"] for r in server.chat_requests] == ["big-model", "test-model"]
    assert [c.model for c in runner.log()] == ["big-model", "test-model"]


def test_per_role_timeouts(server: ScriptedOpenAIServer) -> None:
    llm = OpenAICompatibleLLM(server.url, "m", timeout=10, max_retries=0)
    runner = LLMRunner(llm, timeouts={"labeler": 0.3})
    server.script(slow(5, answer_json(LABEL)))
    assert label_topic(runner, TURNS) is None
    assert runner.log()[-1].duration_ms < 2000


def test_log_is_bounded_but_counts_are_not(server: ScriptedOpenAIServer, llm: OpenAICompatibleLLM) -> None:
    runner = LLMRunner(llm, log_size=3, max_output_chars=20)
    server.script(*[answer_json(LABEL)] * 5)
    for _ in range(5):
        assert label_topic(runner, TURNS) is not None
    assert len(runner.log()) == 3
    assert runner.total_calls == 5
    assert all(len(c.output) <= 20 for c in runner.log())


def test_check_can_reject_a_schema_valid_answer(server: ScriptedOpenAIServer, runner: LLMRunner) -> None:
    server.script(answer_json(LABEL))

    def check(label: TopicLabel) -> TopicLabel:
        raise ValueError("title not allowed")

    assert runner.run("labeler", [ChatMessage("user", "x")], TopicLabel, check=check) is None
    assert "title not allowed" in (runner.log()[-1].error or "")


def test_empty_input_makes_no_call(server: ScriptedOpenAIServer, runner: LLMRunner) -> None:
    assert label_topic(runner, []) is None
    assert server.chat_requests == [] and runner.total_calls == 0


def test_circuit_breaker_skips_a_dead_endpoint_then_retries(server: ScriptedOpenAIServer) -> None:
    llm = OpenAICompatibleLLM(server.url, "m", timeout=1, max_retries=0)
    runner = LLMRunner(llm, breaker_failures=2, breaker_cooldown=0.4)
    server.script(http_error(503), http_error(503), answer_json(LABEL))
    results = [label_topic(runner, TURNS) for _ in range(5)]
    assert results == [None] * 5
    assert len(server.chat_requests) == 2  # the last three never left the process
    skipped = [c for c in runner.log() if (c.error or "").startswith("skipped")]
    assert len(skipped) == 3 and runner.total_calls == 2
    time.sleep(0.45)
    assert label_topic(runner, TURNS) is not None  # half-open: one try, it works, closed again
    assert label_topic(runner, TURNS) is None and len(server.chat_requests) == 4  # unscripted 500 counts again


def test_bad_answers_do_not_open_the_breaker(server: ScriptedOpenAIServer) -> None:
    llm = OpenAICompatibleLLM(server.url, "m", timeout=1, max_retries=0)
    # failure_ttl=0: the same prompt is sent again after a bad answer (the repeat memory is
    # tested on its own below)
    runner = LLMRunner(llm, breaker_failures=2, breaker_cooldown=60, failure_ttl=0)
    server.script(answer("no json"), refusal(), answer("still no json"), answer_json(LABEL))
    for _ in range(3):
        assert label_topic(runner, TURNS) is None
    assert label_topic(runner, TURNS) is not None
    assert len(server.chat_requests) == 4


def test_output_budgets_per_role(server: ScriptedOpenAIServer, llm: OpenAICompatibleLLM) -> None:
    server.script(answer_json(LABEL), answer_json(LABEL))
    label_topic(LLMRunner(llm), TURNS)
    label_topic(LLMRunner(llm, max_tokens={"labeler": 3000}), TURNS)
    assert [r.body["max_tokens"] for r in server.chat_requests] == [500, 3000]


def test_clear_log_forgets_outputs_but_keeps_counts(server: ScriptedOpenAIServer, runner: LLMRunner) -> None:
    server.script(answer_json(LABEL))
    label_topic(runner, TURNS)
    runner.clear_log()
    assert runner.log() == [] and runner.counts() == {"labeler": 1}
