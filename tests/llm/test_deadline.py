"""A hanging LLM cannot hold a recall (issue 19): one overall deadline per recall, and a
circuit breaker across calls, against a real scripted server that never answers in time.

With the default settings a model that hangs blocked each recall for ~92 s (a 30 s timeout,
tried three times), recall after recall."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from arbormem import Memory
from arbormem.config import LLMSettings, Settings
from arbormem.embed.testing import HashEmbedder
from arbormem.llm import LLM, ChatMessage, LLMRunner, OpenAICompatibleLLM
from arbormem.llm.roles import TopicLabel
from tests.conftest import chat
from tests.support.openai_server import ScriptedOpenAIServer, slow


def _memory(server: ScriptedOpenAIServer, settings: Settings | None = None) -> Memory:
    mem = Memory(":memory:", embedder=HashEmbedder(), settings=settings or Settings(),
                 llm=OpenAICompatibleLLM(server.url, "test-model"))  # the adapter's defaults
    mem.add_many([{"messages": chat(f"planning the garden, bed {i} gets tomatoes", "sounds good")}
                  for i in range(6)], user_id="u")
    return mem


def _hang(server: ScriptedOpenAIServer) -> None:
    server.responder = lambda body: slow(120)  # every request: no answer for two minutes


def test_default_settings_bound_a_recall_by_the_deadline(server: ScriptedOpenAIServer) -> None:
    _hang(server)
    with _memory(server) as mem:
        t0 = time.monotonic()
        r = mem.recall("what goes in the garden bed?", user_id="u")
        took = time.monotonic() - t0
        assert took < 1.2 + 0.8, took  # the default deadline is 1.2 s; this was ~92 s
        assert mem.settings.llm.recall_deadline == 1.2
        assert r.exchanges  # the offline ranking answered
        assert any("llm plan failed" in n and "deadline" in n for n in r.trace.notes), r.trace.notes


def test_the_breaker_spares_later_recalls(server: ScriptedOpenAIServer) -> None:
    _hang(server)
    s = Settings(llm=LLMSettings(recall_deadline=0.3, breaker_failures=2, breaker_cooldown=1.0))
    with _memory(server, s) as mem:
        times = []
        for i in range(5):  # distinct queries: a prompt that timed out is never resent
            t0 = time.monotonic()
            mem.recall(f"garden bed {'abcde'[i]}", user_id="u")
            times.append(time.monotonic() - t0)
        assert all(t < 0.3 + 0.8 for t in times[:2])
        assert all(t < 0.25 for t in times[2:]), times  # the breaker is open: no call at all
        assert len(server.chat_requests) == 2
        skipped = [c for c in mem.llm_log() if (c.error or "").startswith("skipped")]
        assert len(skipped) == 3
        time.sleep(1.05)
        mem.recall("garden bed f", user_id="u")  # half-open: one probe, it fails, open again
        mem.recall("garden bed g", user_id="u")
        assert len(server.chat_requests) == 3


class _Stuck(LLM):
    """An LLM that ignores its timeout and never returns (a wedged client library)."""

    name = "stuck"

    def __init__(self) -> None:
        self.release = threading.Event()

    def chat(self, messages: Sequence[ChatMessage], *, model: str | None = None, max_tokens: int = 512,
             temperature: float = 0.0, json_mode: bool = False, timeout: float | None = None) -> str:
        self.release.wait(60)
        return '{"title": "late", "keywords": ["late"]}'


def test_the_deadline_holds_for_an_llm_that_ignores_timeouts() -> None:
    stuck = _Stuck()
    runner = LLMRunner(stuck, breaker_failures=1, breaker_cooldown=0.2)
    msgs = [ChatMessage("user", "label this")]

    def other() -> list[ChatMessage]:  # a fresh prompt each time: a timed-out one is not resent
        return [ChatMessage("user", f"label this {time.monotonic()}")]
    try:
        t0 = time.monotonic()
        assert runner.run("labeler", msgs, TopicLabel, deadline=time.monotonic() + 0.3) is None
        assert time.monotonic() - t0 < 0.6
        assert "deadline" in (runner.log()[-1].error or "")
        # Open: skipped at once; after the cooldown only one of two concurrent calls probes.
        assert runner.run("labeler", other(), TopicLabel, deadline=time.monotonic() + 5) is None
        assert runner.log()[-1].error.startswith("skipped") and runner.log()[-1].skip == "breaker"
        assert runner.run("labeler", msgs, TopicLabel, deadline=time.monotonic() + 5) is None
        assert runner.log()[-1].skip == "repeat"
        time.sleep(0.25)
        out: list[object] = []
        calls = [threading.Thread(target=lambda: out.append(
            runner.run("labeler", other(), TopicLabel, deadline=time.monotonic() + 0.5))) for _ in range(2)]
        for t in calls:
            t.start()
        for t in calls:
            t.join()
        errors = [c.error or "" for c in runner.log()[-2:]]
        assert sum(e.startswith("skipped") and "probing" in e for e in errors) == 1, errors
    finally:
        stuck.release.set()


def test_a_passed_deadline_makes_no_call(server: ScriptedOpenAIServer) -> None:
    runner = LLMRunner(OpenAICompatibleLLM(server.url, "m"))
    assert runner.run("labeler", [ChatMessage("user", "x")], TopicLabel, deadline=time.monotonic() - 1) is None
    assert server.chat_requests == [] and "deadline" in (runner.log()[-1].error or "")
