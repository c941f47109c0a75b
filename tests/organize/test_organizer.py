"""The background Organizer and the LLM veto, against real things: a real SQLite file, a real
thread, and the scripted OpenAI-compatible server on loopback for the veto."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from arbormem import Memory
from arbormem.embed.testing import BrokenEmbedder, HashEmbedder
from arbormem.llm import LLMRunner, OpenAICompatibleLLM
from arbormem.organize.consolidate import ConsolidationOptions
from arbormem.organize.organizer import Organizer
from tests.conftest import chat
from tests.support.openai_server import (
    API_KEY,
    Behaviour,
    ScriptedOpenAIServer,
    answer_json,
    garbage_body,
)

from .conftest import check_tree, fragmented


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer() as srv:
        yield srv


@pytest.fixture
def runner(server: ScriptedOpenAIServer) -> Iterator[LLMRunner]:
    client = OpenAICompatibleLLM(server.url, "test-model", api_key=API_KEY, timeout=5.0, max_retries=0, backoff=0.01)
    yield LLMRunner(client)
    client.close()


def _wait(cond, timeout: float = 15.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return False


def test_organizer_consolidates_once_idle_and_not_again_until_new_writes(db_path: Path) -> None:
    mem = Memory(db_path, embedder=HashEmbedder())
    with Organizer(mem, idle_seconds=0.3, interval=0.05) as org:
        mem.add_many(fragmented(120), user_id="u")
        assert _wait(lambda: org.runs >= 1)
        report = org.reports[0]
        assert report.user_id == "u" and report.merged > 0
        time.sleep(0.5)
        assert org.runs == 1, "nothing new was written: no second run"
        mem.add(chat("one more sourdough loaf question", "sure"), user_id="u")
        assert _wait(lambda: org.runs >= 2)
    assert not org.running and not org.errors
    check_tree(mem, "u")
    mem.close()


def test_organizer_waits_while_the_user_is_active(db_path: Path) -> None:
    mem = Memory(db_path, embedder=HashEmbedder())
    mem.add_many(fragmented(40), user_id="u")
    now = [0.0]
    org = Organizer(mem, idle_seconds=60, interval=1, clock=lambda: now[0])
    assert org.tick() == []            # first sight: activity just now
    now[0] = 59.0
    assert org.tick() == []
    mem.add(chat("still talking about sourdough", "ok"), user_id="u")
    now[0] = 61.0
    assert org.tick() == []            # the new write restarted the idle clock
    now[0] = 122.0
    assert [r.user_id for r in org.tick()] == ["u"]
    mem.close()


def test_organizer_reports_failures_and_keeps_running(db_path: Path) -> None:
    good = Memory(db_path, embedder=HashEmbedder())
    good.add_many(fragmented(60), user_id="u")
    good.close()
    # Same file, an embedder that fails (the tag pass embeds): the run fails, is reported.
    broken = Memory(db_path, embedder=BrokenEmbedder("explode", dim=256))
    with Organizer(broken, idle_seconds=0, interval=0.05) as org:
        assert _wait(lambda: len(org.errors) >= 1)
        assert org.running
    err = org.errors[0]
    assert err.user_id == "u" and err.error
    broken.close()


def test_llm_veto_decides_and_no_verdict_keeps_topics_apart(db_path: Path, server: ScriptedOpenAIServer,
                                                             runner: LLMRunner) -> None:
    mem = Memory(db_path, embedder=HashEmbedder(), llm=runner)
    mem.add_many(fragmented(120), user_id="u")
    only_merge = ConsolidationOptions(link=False, archive=False, dedup=False, supersede=False, tags=False)
    server.responder = lambda body: garbage_body()
    r = mem.consolidate("u", options=only_merge)
    assert r.merged == 0 and r.vetoed > 0 and r.llm_calls >= 1
    # The scripted model changes its answers below, as a new model would: the prompts that got
    # garbage are not resent unless the runner forgets them (issue 23).
    runner.forget_failures()
    server.responder = lambda body: answer_json({"same_topic": False, "reason": "different subjects"})
    r = mem.consolidate("u", options=only_merge)
    assert r.merged == 0 and r.vetoed == r.llm_calls > 0
    assert r.llm_calls <= only_merge.max_llm_calls
    assert "merge two topics" in server.requests[-1].system_prompt
    server.responder = lambda body: answer_json({"same_topic": True, "reason": "same sourdough topic"})
    r = mem.consolidate("u", options=only_merge)
    assert r.merged > 0
    merge = next(c for c in mem.store.list_changes("u") if c.action == "merge")
    assert merge.detail["veto"] == {"by": "llm", "verdict": True, "reason": "same sourdough topic"}
    check_tree(mem, "u")
    mem.close()


def test_writes_complete_while_the_veto_waits_for_a_slow_model(db_path: Path, server: ScriptedOpenAIServer,
                                                                runner: LLMRunner) -> None:
    mem = Memory(db_path, embedder=HashEmbedder(), llm=runner)
    mem.add_many(fragmented(120), user_id="u")
    slow = Behaviour(content=json.dumps({"same_topic": True}), delay=1.5, label="slow")
    server.responder = lambda body: slow
    done = threading.Event()
    out = []
    t = threading.Thread(target=lambda: (out.append(mem.consolidate("u", options=ConsolidationOptions(max_llm_calls=1))),
                                         done.set()))
    t.start()
    assert _wait(lambda: server.in_flight > 0, 5)
    t0 = time.perf_counter()
    x = mem.begin("a new question while the organiser thinks", user_id="u")
    mem.complete(x.id, "an answer")
    mem.recall("sourdough", user_id="u", max_tokens=200, use_llm=False)
    assert time.perf_counter() - t0 < 1.0, "no lock is held during the LLM call"
    assert not done.is_set()
    t.join(10)
    assert out and out[0].llm_calls == 1
    check_tree(mem, "u")
    mem.close()
