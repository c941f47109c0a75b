"""Never repeated in vain (issue 23): a timed-out chat request is not retried, a prompt that
timed out or got an invalid answer is not sent again while remembered, an organize run goes
on to older topics past bad answers and stops at its time budget, and every call is counted
as what it was (ok, invalid, timeout, error, or skipped and why). Against the real scripted
server on loopback."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from click.testing import CliRunner

from arbormem import Memory
from arbormem.cli import main
from arbormem.config import Settings
from arbormem.embed.testing import HashEmbedder
from arbormem.llm import ChatMessage, LLMRunner, OpenAICompatibleLLM
from arbormem.llm.openai import LLMTimeout
from arbormem.llm.prompts import Turn
from arbormem.llm.roles import TopicLabel, label_topic
from tests.support.openai_server import (
    Behaviour,
    ScriptedOpenAIServer,
    answer,
    answer_json,
    http_error,
    slow,
)

TURNS = [Turn(1, "How often should I feed my rye starter?", "Twice a day.")]
LABEL = {"title": "Rye starter feeding", "keywords": ["rye", "starter"], "summary": "Feed the rye starter twice a day."}


def test_a_timed_out_chat_request_is_not_retried(server: ScriptedOpenAIServer) -> None:
    client = OpenAICompatibleLLM(server.url, "m", timeout=0.3, max_retries=2, backoff=0.01)
    server.script(slow(2, answer("late")), answer("would have worked"))
    with pytest.raises(LLMTimeout):
        client.chat([ChatMessage("user", "hi")])
    assert len(server.chat_requests) == 1  # was 3: 1 + max_retries, each timing out again


def test_a_failed_prompt_is_not_sent_again_until_forgotten(server: ScriptedOpenAIServer) -> None:
    runner = LLMRunner(OpenAICompatibleLLM(server.url, "m", timeout=0.3, max_retries=0), failure_ttl=0.5)
    server.script(answer("no json"), slow(2, answer_json(LABEL)), answer_json(LABEL))
    other = [Turn(1, "Which flour for a rye starter?", "Whole rye.")]
    assert label_topic(runner, TURNS) is None            # invalid answer
    assert label_topic(runner, TURNS) is None            # the same prompt: skipped, not sent
    assert label_topic(runner, other) is None            # another prompt: sent, times out
    assert label_topic(runner, other) is None            # skipped too
    assert len(server.chat_requests) == 2
    assert [c.outcome for c in runner.log()] == ["invalid", "skipped", "timeout", "skipped"]
    assert [c.skip for c in runner.log()] == [None, "repeat", None, "repeat"]
    time.sleep(0.55)  # remembered for failure_ttl seconds
    assert label_topic(runner, TURNS) is not None
    u = runner.usage()
    assert (u.calls, u.ok, u.invalid, u.timeouts, u.errors, u.failures) == (3, 1, 1, 1, 0, 2)
    assert (u.skipped, u.skipped_repeat, u.skipped_breaker) == (2, 2, 0)
    assert runner.counts() == {"labeler": 3} and runner.failure_counts() == {"labeler": 2}


def test_endpoint_errors_are_not_remembered(server: ScriptedOpenAIServer) -> None:
    runner = LLMRunner(OpenAICompatibleLLM(server.url, "m", timeout=1, max_retries=0))
    server.script(http_error(503), answer_json(LABEL))
    assert label_topic(runner, TURNS) is None
    assert label_topic(runner, TURNS) is not None  # a server error says nothing about the prompt


def test_skips_are_counted_as_skips_not_failures(server: ScriptedOpenAIServer) -> None:
    runner = LLMRunner(OpenAICompatibleLLM(server.url, "m", timeout=1, max_retries=0), breaker_failures=1,
                       breaker_cooldown=60)
    server.responder = lambda body: http_error(500)
    for i in range(3):
        runner.run("labeler", [ChatMessage("user", f"x{i}")], TopicLabel)
    runner.run("labeler", [ChatMessage("user", "late")], TopicLabel, deadline=time.monotonic() - 1)
    u = runner.usage()
    assert (u.calls, u.errors, u.failures, u.skipped_breaker, u.skipped_deadline) == (1, 1, 1, 2, 1)
    assert "1 calls (0 ok, 0 invalid, 0 timed out, 1 errors); 3 skipped (breaker open 2" in u.summary()


# -- organize ----------------------------------------------------------------------------------------
T0 = datetime(2024, 3, 1, 9, 0, tzinfo=timezone.utc)
WORDS = ["sourdough", "bicycle", "taxes", "kyoto", "piano", "garden", "chess", "sailing", "knitting",
         "pottery", "climbing", "birding", "cheese", "coffee", "guitar", "origami", "astronomy", "fencing"]


def many_topics() -> list[dict[str, Any]]:
    """One session per subject: 18 topics, the first 17 frozen."""
    return [{"messages": [{"role": "user", "content": f"{w}? {w}!"},
                          {"role": "assistant", "content": f"{w}: {w}."}],
             "session_id": f"s{i}", "at": (T0 + timedelta(days=i)).isoformat()} for i, w in enumerate(WORDS)]


def tree_settings() -> Settings:
    s = Settings()
    s.tree.continue_threshold = -1.0  # topics follow sessions exactly (the hash embedder is crude)
    return s


def batch_labels(body: dict[str, Any], good: set[str]) -> Behaviour:
    """Labels for a batch: grounded titles for subjects in ``good``, the handle as the title
    (junk) for the others."""
    user = body["messages"][-1]["content"]
    blocks = re.findall(r"^== (T\d+)[^\n]*\n(.*?)(?=^== |\Z)", user, re.M | re.S)
    out = []
    for handle, text in blocks:
        word = next(w for w in WORDS if w in text)
        title = f"All about {word}" if word in good else handle
        out.append({"id": handle, "title": title, "keywords": [word], "summary": f"The user asked about {word}."})
    return answer_json({"topics": out})


def test_a_run_goes_past_bad_answers_and_the_next_run_moves_on(server: ScriptedOpenAIServer) -> None:
    server.responder = lambda body: batch_labels(body, good=set())
    llm = OpenAICompatibleLLM(server.url, "m", timeout=2, max_retries=0)
    with Memory(":memory:", embedder=HashEmbedder(), llm=llm, settings=tree_settings()) as mem:
        mem.add_many(many_topics(), user_id="u")
        first = mem.organize("u")
        # Every batch was tried: the run did not stop after 3 bad answers (12 topics) as before.
        assert (first.candidates, first.failed, first.llm_calls, first.stopped_early) == (17, 17, 5, False)
        second = mem.organize("u")
        assert (second.llm_calls, second.skipped, second.labelled) == (0, 17, 0)  # nothing resent
        assert mem.llm is not None and mem.llm.usage().skipped_repeat == 5
        # Older subjects answer well: they are reached although the newest keep failing.
        server.responder = lambda body: batch_labels(body, good=set(WORDS[:8]))
        mem.llm.forget_failures()
        third = mem.organize("u")
        titles = {t.title for t in mem.topics(user_id="u") if t.kind == "topic"}
        assert third.labelled == 8 and {f"All about {w}" for w in WORDS[:8]} <= titles


def test_an_organize_run_stops_at_its_budget(server: ScriptedOpenAIServer) -> None:
    server.responder = lambda body: slow(5, answer_json({"topics": []}))
    llm = OpenAICompatibleLLM(server.url, "m", timeout=30, max_retries=2)
    with Memory(":memory:", embedder=HashEmbedder(), llm=llm, settings=tree_settings()) as mem:
        mem.add_many(many_topics(), user_id="u")
        t0 = time.monotonic()
        report = mem.organize("u", budget=0.5)
        assert time.monotonic() - t0 < 1.5
        assert report.stopped_early and report.labelled == 0
        assert "budget" in (report.stop_reason or "")
        assert len(server.chat_requests) == 1
        assert mem.llm is not None and mem.llm.usage().timeouts == 1


# -- settings from the environment and the CLI -------------------------------------------------------
def test_role_timeouts_and_budgets_from_the_environment(server: ScriptedOpenAIServer,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARBORMEM_LLM__BASE_URL", server.url)
    monkeypatch.setenv("ARBORMEM_LLM__MODEL", "m")
    monkeypatch.setenv("ARBORMEM_LLM__TIMEOUTS__LABELER", "0.3")
    monkeypatch.setenv("ARBORMEM_LLM__ORGANIZE_BUDGET", "7")
    monkeypatch.setenv("ARBORMEM_LLM__RECALL_DEADLINE", "0.8")
    monkeypatch.setenv("ARBORMEM_LLM__FAILURE_TTL", "0")
    with Memory(":memory:", embedder=HashEmbedder()) as mem:
        assert mem.llm is not None
        assert mem.llm.timeouts["labeler"] == 0.3
        assert mem.settings.llm.organize_budget == 7 and mem.settings.llm.recall_deadline == 0.8
        server.script(slow(3, answer_json(LABEL)))
        t0 = time.monotonic()
        assert label_topic(mem.llm, TURNS) is None
        assert time.monotonic() - t0 < 1.0
        assert mem.llm.last_call() is not None and mem.llm.last_call().outcome == "timeout"


def test_cli_options_override_the_environment(server: ScriptedOpenAIServer, monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Any) -> None:
    monkeypatch.setenv("ARBORMEM_LLM__BASE_URL", server.url)
    monkeypatch.setenv("ARBORMEM_LLM__MODEL", "m")
    monkeypatch.setenv("ARBORMEM_LLM__TIMEOUTS__VETO", "4")
    server.responder = lambda body: slow(5, answer("{}"))
    db = str(tmp_path / "m.db")
    with Memory(db, embedder=HashEmbedder(), settings=tree_settings()) as mem:
        mem.add_many(many_topics()[:3], user_id="u")
    t0 = time.monotonic()
    res = CliRunner().invoke(main, ["recall", "about piano", "--db", db, "--user", "u", "--embedder", "hash",
                                    "--llm-deadline", "0.3", "--json"])
    assert res.exit_code == 0, res.output
    assert time.monotonic() - t0 < 5  # the model takes 5 s; the recall did not wait for it
    assert any("deadline" in n for n in json.loads(res.output)["trace"]["notes"])
    res = CliRunner().invoke(main, ["organize", "--db", db, "--user", "u", "--embedder", "hash",
                                    "--llm-timeout", "labeler=0.2", "--llm-budget", "5", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["llm"]["timeouts"] == 1 and out["llm"]["calls"] == 1
    bad = CliRunner().invoke(main, ["organize", "--db", db, "--llm-timeout", "labeler=-1"])
    assert bad.exit_code == 2 and "ROLE=SECONDS" in bad.output


def test_demo_and_stats_count_calls_failures_and_skips_apart(server: ScriptedOpenAIServer, tmp_path: Any) -> None:
    server.responder = lambda body: http_error(500)
    db = str(tmp_path / "demo.db")
    res = CliRunner().invoke(main, ["demo", "--db", db, "--embedder", "hash",
                                    "--llm-base-url", server.url, "--llm-model", "m"])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("LLM: "))
    # 3 labeler calls fail (the run stops), the breaker opens, the planner is skipped: the
    # demo printed "3 calls, 4 failed" for this before.
    assert line == ("LLM: 3 calls (0 ok, 0 invalid, 0 timed out, 3 errors); 1 skipped "
                    "(breaker open 1, deadline passed 0, failed before 0)"), line
    res = CliRunner().invoke(main, ["stats", "--db", db, "--user", "demo", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["llm_labelled"] == 0


def test_a_long_run_budget_never_stretches_one_call(server: ScriptedOpenAIServer) -> None:
    server.responder = lambda body: slow(3, answer_json({"topics": []}))
    llm = OpenAICompatibleLLM(server.url, "m", timeout=0.3, max_retries=0)  # the default per call
    with Memory(":memory:", embedder=HashEmbedder(), llm=llm, settings=tree_settings()) as mem:
        mem.add_many(many_topics(), user_id="u")
        t0 = time.monotonic()
        report = mem.organize("u", budget=60)
        # 3 calls of 0.3 s each time out (not 60 s for the first), then the run stops
        assert time.monotonic() - t0 < 2.5 and report.llm_calls == 3
        assert report.stop_reason == "3 calls in a row timed out or failed"
