"""Memory with an LLM over the scripted server: labels from good answers; with every kind of
bad answer the stored tree is exactly the offline one and holds no error text."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as settings_
from hypothesis import strategies as st

from arbormem import Memory
from arbormem.config import Settings
from arbormem.embed.testing import HashEmbedder
from arbormem.errors import NotFoundError
from arbormem.llm import LLMRunner, OpenAICompatibleLLM
from arbormem.models import Topic
from arbormem.organize.enrich import organize_labels
from tests.support.openai_server import (
    Behaviour,
    ScriptedOpenAIServer,
    answer,
    answer_json,
    empty,
    garbage_body,
    http_error,
    refusal,
    slow,
    truncated,
)

T0 = datetime(2024, 3, 1, 9, 0, tzinfo=timezone.utc)

# Five sessions on five subjects; a new session always starts a new topic, so the first four
# topics are frozen when ingestion ends and the fifth stays open.
SUBJECTS = [
    ("sourdough", ["How often do I feed my sourdough starter?", "Twice a day with rye flour and water.",
                   "The starter smells of acetone.", "Feed it more often; it is hungry.",
                   "Can I keep the starter in the fridge?", "Yes, feed it weekly then."]),
    ("bicycle", ["My bicycle chain keeps slipping.", "Check the derailleur cable tension.",
                 "Which chain lube works in rain?", "A wet lube such as a ceramic one."]),
    ("taxes", ["When is the tax return due?", "The filing deadline is the end of July.",
               "Can I deduct my home office?", "Yes, if the room is used only for work."]),
    ("kyoto", ["Plan three days in Kyoto in October.", "Day one Fushimi Inari, day two Arashiyama.",
               "Where should we stay?", "A ryokan near Gion is central."]),
    ("piano", ["Which piano scales should I practise first?", "Start with C major and A minor."]),
]


def items() -> list[dict[str, Any]]:
    out = []
    for s, (_, lines) in enumerate(SUBJECTS):
        for i in range(0, len(lines), 2):
            out.append({
                "messages": [{"role": "user", "content": lines[i]}, {"role": "assistant", "content": lines[i + 1]}],
                "session_id": f"s{s}",
                "at": (T0 + timedelta(days=s, minutes=i)).isoformat(),
            })
    return out


def settings() -> Settings:
    s = Settings()
    s.tree.max_children = 3  # force fan-out splits, which rewrite (reparent) frozen topics
    s.tree.continue_threshold = -1.0  # topics follow sessions exactly (the hash embedder is crude)
    s.tree.reply_threshold = -1.0
    return s


def good_label(text: str) -> dict[str, Any]:
    subject = next((name for name, lines in SUBJECTS if any(line in text for line in lines)), "unknown")
    return {
        "title": f"LLM title {subject}",
        "keywords": [subject, "llmkw"],
        "retrieval_terms": [f"zz{subject}term"],
        "trigger": f"when the user asks about {subject}",
        "summary": f"LLM summary of {subject}.",
    }


def label_for(body: dict[str, Any]) -> Behaviour:
    """A well-behaved model: labels name the subject found in the prompt; plans pick T1."""
    system = body["messages"][0]["content"]
    user = body["messages"][-1]["content"]
    if "You name and summarise several topics" in system:
        parts = re.split(r"^== (T\d+).*$", user, flags=re.M)
        return answer_json({"topics": [
            {"id": handle, **good_label(block)} for handle, block in zip(parts[1::2], parts[2::2], strict=True)
        ]})
    if "You name and summarise" in system:
        subject = next((name for name, lines in SUBJECTS if lines[0] in user), "unknown")
        return answer_json({
            "title": f"LLM title {subject}",
            "keywords": [subject, "llmkw"],
            "retrieval_terms": [f"zz{subject}term"],
            "trigger": f"when the user asks about {subject}",
            "summary": f"LLM summary of {subject}.",
        })
    if "You write the detailed summary" in system:
        return answer_json({"detail": "LLM detail: " + good_label(user)["summary"]})
    if "You plan a memory search" in system:
        return answer_json({"semantic_query": "sourdough starter feeding", "intent": "fact",
                            "time_range": None, "needs_memory": True, "topic_ids": ["T1"]})
    return http_error(400, message="unexpected role")


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer() as srv:
        yield srv


def llm_memory(server: ScriptedOpenAIServer, timeout: float = 2.0) -> Memory:
    client = OpenAICompatibleLLM(server.url, "test-model", timeout=timeout, max_retries=1, backoff=0.01)
    return Memory(":memory:", embedder=HashEmbedder(), llm=client, settings=settings())


def snapshot(mem: Memory, user_id: str = "u") -> Any:
    """The stored tree without its random ids: structure, labels, spans, states, index text."""

    def node(t: Topic) -> Any:
        rec = mem.store.get_topic(t.id) if t.kind != "root" else None
        return (t.kind, t.title, t.keywords, t.summary, t.start_seq, t.end_seq, t.size, t.frozen,
                rec.meta.label_source if rec else None,
                tuple(node(c) for c in t.children))

    return node(mem.tree(user_id=user_id))


def stored_texts(mem: Memory, user_id: str = "u") -> list[str]:
    out = []
    for t in mem.topics(user_id=user_id):
        rec = mem.store.get_topic(t.id)
        out += [t.title, t.summary, *t.keywords, json.dumps(rec.meta.encode() if rec else {})]
    out += [e.text for e in mem.exchanges(user_id=user_id)]
    return out


def test_write_path_makes_no_llm_calls(server: ScriptedOpenAIServer) -> None:
    server.responder = label_for
    with llm_memory(server) as mem:
        mem.add_many(items(), user_id="u")
        ex = mem.begin("One more question about the sourdough starter", user_id="u", session_id="s0")
        mem.complete(ex.id, "Sure.")
        assert server.chat_requests == []
        assert mem.llm_log() == []


def test_good_answers_label_frozen_topics(server: ScriptedOpenAIServer) -> None:
    server.responder = label_for
    with llm_memory(server) as mem:
        mem.add_many(items(), user_id="u")
        frozen = [t for t in mem.topics(user_id="u") if t.kind == "topic" and t.frozen]
        assert len(frozen) == 4
        report = mem.organize("u")
        # Four frozen topics, labelled four to a call: one LLM call.
        assert (report.candidates, report.labelled, report.failed, report.llm_calls) == (4, 4, 0, 1)

        topics = {t.title: t for t in mem.topics(user_id="u") if t.kind == "topic"}
        for name in ("sourdough", "bicycle", "taxes", "kyoto"):
            t = topics[f"LLM title {name}"]
            assert t.summary == f"LLM summary of {name}." and t.keywords == (name, "llmkw")
        open_topic = [t for t in topics.values() if not t.frozen]
        assert len(open_topic) == 1 and not open_topic[0].title.startswith("LLM")  # never the open one
        # Retrieval terms reach the topic index, so words the transcript never used find it.
        hits = mem.store.text_search("u", "topic", ["zzkyototerm"], 5)
        assert [topics["LLM title kyoto"].id] == [tid for tid, _ in hits]
        # Themes list their children's new titles.
        # (unrelated subjects sit at the top level: only a theme over labelled topics is checked)
        for theme in (t for t in mem.topics(user_id="u") if t.kind == "theme"):
            if any(t.parent_id == theme.id and t.title.startswith("LLM") for t in topics.values()):
                assert "LLM title" in theme.summary
        # A second run has nothing to do.
        assert mem.organize("u").llm_calls == 0
        assert [c.role for c in mem.llm_log()] == ["labeler"] and all(c.ok for c in mem.llm_log())


def test_llm_labels_survive_later_writes(server: ScriptedOpenAIServer) -> None:
    server.responder = label_for
    with llm_memory(server) as mem:
        mem.add_many(items(), user_id="u")
        mem.organize("u")
        before = {t.id: t.title for t in mem.topics(user_id="u") if t.title.startswith("LLM")}
        # Many new sessions: new topics, fan-out splits that move the labelled topics around.
        more = [{"messages": [{"role": "user", "content": f"question {i} about gardening tomatoes {i}"},
                              {"role": "assistant", "content": f"answer {i} on watering"}],
                 "session_id": f"g{i}", "at": (T0 + timedelta(days=10 + i)).isoformat()} for i in range(12)]
        mem.add_many(more, user_id="u")
        after = {t.id: t.title for t in mem.topics(user_id="u")}
        assert all(after[tid] == title for tid, title in before.items())
        assert mem.store.list_changes("u", limit=1000)  # splits happened and were logged


def test_recall_costs_one_llm_call_and_uses_the_plan(server: ScriptedOpenAIServer) -> None:
    server.responder = label_for
    with llm_memory(server) as mem:
        mem.add_many(items(), user_id="u")
        n = len(server.chat_requests)
        rec = mem.recall("what did we say about it?", user_id="u", max_tokens=400)
        assert len(server.chat_requests) == n + 1
        assert any(note.startswith("llm plan: intent=fact, topics=1") for note in rec.trace.notes)
        assert any("sourdough" in e.text for e in rec.exchanges)
        assert rec.tokens <= 400
        # The directory the planner saw is bounded and holds leaf topics only.
        prompt = server.chat_requests[-1].body["messages"][-1]["content"]
        assert 1 <= len(re.findall(r"^T\d+:", prompt, re.M)) <= 20
        # use_llm=False: no call.
        mem.recall("sourdough", user_id="u", use_llm=False)
        assert len(server.chat_requests) == n + 1


BAD: dict[str, Behaviour] = {
    "http-500": http_error(500),
    "http-429": http_error(429, retry_after=0),
    "http-401": http_error(401),
    "timeout": slow(2, answer("{}")),
    "refusal": refusal(),
    "refusal-text": refusal(field_=False),
    "truncated": truncated({"title": "Sourdough", "keywords": ["a"], "summary": "b" * 40}, 0.5, "length"),
    "truncated-stop": truncated({"title": "Sourdough", "keywords": ["a"], "summary": "b" * 40}, 0.5, "stop"),
    "wrong-schema": answer_json({"topic": "Sourdough", "tags": ["a"]}),
    "prose": answer("Error: the model could not produce a title."),
    "empty": empty(),
    "garbage": garbage_body(),
    "placeholder": answer_json({"title": "<title>", "keywords": ["<keyword>"], "summary": "..."}),
    "error-string": answer_json("Error"),
}
ERROR_MARKERS = re.compile(r"error|scripted|sorry|refus|http|traceback|timeout|<title>|bad gateway", re.I)


@pytest.mark.parametrize("kind", list(BAD))
def test_every_bad_answer_leaves_the_offline_tree(server: ScriptedOpenAIServer, kind: str) -> None:
    server.responder = lambda body: BAD[kind]
    with Memory(":memory:", embedder=HashEmbedder(), settings=settings()) as offline, \
            llm_memory(server, timeout=0.3) as mem:
        offline.add_many(items(), user_id="u")
        mem.add_many(items(), user_id="u")
        report = mem.organize("u")
        assert (report.labelled, report.failed, report.llm_calls) == (0, 4, 1)
        assert snapshot(mem) == snapshot(offline)
        for text in stored_texts(mem):
            assert not ERROR_MARKERS.search(text), text
        failures = mem.llm_log(failures_only=True)
        assert len(failures) == 1 and failures[0].role == "labeler" and failures[0].error

        rec = mem.recall("sourdough starter", user_id="u", max_tokens=400)
        ref = offline.recall("sourdough starter", user_id="u", max_tokens=400)
        assert rec.text == ref.text
        assert any(n.startswith("llm plan failed, offline ranking used") for n in rec.trace.notes)
        assert snapshot(mem) == snapshot(offline)


def test_a_bad_item_in_a_batch_only_costs_its_own_topic(server: ScriptedOpenAIServer) -> None:
    def one_bad(body: dict[str, Any]) -> Behaviour:
        good = json.loads(label_for(body).content or "{}")
        good["topics"][0]["title"] = "<title>"  # invalid: that topic keeps its offline labels
        good["topics"].append({**good["topics"][1], "id": "T99"})  # unknown handle: ignored
        return answer_json(good)

    server.responder = one_bad
    with llm_memory(server) as mem, Memory(":memory:", embedder=HashEmbedder(), settings=settings()) as offline:
        mem.add_many(items(), user_id="u")
        offline.add_many(items(), user_id="u")
        report = mem.organize("u")
        assert (report.labelled, report.failed, report.llm_calls) == (3, 1, 1)
        offline_titles = {t.start_seq: t.title for t in offline.topics(user_id="u") if t.kind == "topic"}
        unlabelled = [t for t in mem.topics(user_id="u") if t.kind == "topic" and t.frozen
                      and not t.title.startswith("LLM title")]
        assert len(unlabelled) == 1 and unlabelled[0].title == offline_titles[unlabelled[0].start_seq]
        server.responder = label_for
        again = mem.organize("u")  # the failed topic is retried, alone
        assert (again.candidates, again.labelled, again.llm_calls) == (1, 1, 1)


def test_a_dead_endpoint_stops_the_run_early(server: ScriptedOpenAIServer) -> None:
    server.responder = lambda body: http_error(503)
    with llm_memory(server) as mem:
        mem.add_many(items(), user_id="u")
        assert mem.llm is not None
        report = organize_labels(mem.store, mem.llm, "u", mem.settings.tree, batch=1, max_failures=3)
        assert (report.candidates, report.failed, report.llm_calls, report.stopped_early) == (4, 3, 3, True)
        assert len(server.chat_requests) == 6  # 3 calls x (1 + max_retries=1)


def test_environment_configures_the_llm(server: ScriptedOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARBORMEM_LLM__BASE_URL", server.url)
    monkeypatch.setenv("ARBORMEM_LLM__MODEL", "env-model")
    server.responder = label_for
    with Memory(":memory:", embedder=HashEmbedder()) as mem:
        assert isinstance(mem.llm, LLMRunner)
        mem.add_many(items(), user_id="u")
        report = mem.organize("u")
        assert report.labelled == report.candidates >= 4
        assert {r.body["model"] for r in server.chat_requests} == {"env-model"}
        assert all(t.title.startswith("LLM title") for t in mem.topics(user_id="u") if t.kind == "topic" and t.frozen)


def test_offline_memory_never_calls_anything() -> None:
    with Memory(":memory:", embedder=HashEmbedder()) as mem:
        mem.add_many(items(), user_id="u")
        assert mem.llm is None
        report = mem.organize("u")
        assert report.llm_calls == 0 and mem.llm_log() == []
        assert mem.recall("sourdough", user_id="u").trace.notes == ()


def test_detailed_summary_is_lazy_and_cached(server: ScriptedOpenAIServer) -> None:
    server.responder = label_for
    with llm_memory(server) as mem:
        mem.add_many(items(), user_id="u")
        topic = next(t for t in mem.topics(user_id="u") if t.kind == "topic" and t.start_seq == 1)
        assert server.chat_requests == []  # nothing until someone asks
        detail = mem.topic_detail(topic.id, user_id="u")
        assert detail == "LLM detail: LLM summary of sourdough."
        assert mem.topic_detail(topic.id, user_id="u") == detail
        assert len(server.chat_requests) == 1  # cached
        with pytest.raises(NotFoundError):
            mem.topic_detail(topic.id, user_id="someone-else")


def test_failed_detailed_summary_is_none_and_not_cached(server: ScriptedOpenAIServer) -> None:
    server.responder = lambda body: answer("Error: model overloaded")
    with llm_memory(server) as mem, Memory(":memory:", embedder=HashEmbedder(), settings=settings()) as offline:
        mem.add_many(items(), user_id="u")
        offline.add_many(items(), user_id="u")
        topic = next(t for t in mem.topics(user_id="u") if t.kind == "topic" and t.start_seq == 1)
        assert mem.topic_detail(topic.id, user_id="u") is None
        assert mem.topic_detail(topic.id, user_id="u") is None
        # never cached, and the prompt that got a bad answer is not sent again in vain
        assert len(server.chat_requests) == 1
        assert mem.llm is not None and mem.llm.last_call() is not None and mem.llm.last_call().skip == "repeat"
        assert snapshot(mem) == snapshot(offline)
        assert not any(ERROR_MARKERS.search(t) for t in stored_texts(mem))
        offline_topic = next(t for t in offline.topics(user_id="u") if t.kind == "topic")
        assert offline.topic_detail(offline_topic.id, user_id="u") is None


def test_recall_on_an_empty_memory_makes_no_call(server: ScriptedOpenAIServer) -> None:
    server.responder = label_for
    with llm_memory(server) as mem:
        rec = mem.recall("anything about sourdough?", user_id="nobody")
        assert rec.text == "" and server.chat_requests == []


def _mangle(reply: str, cut: int, mode: str) -> str:
    if mode == "cut":
        return reply[: cut % (len(reply) + 1)]
    if mode == "drop-char":
        i = cut % max(1, len(reply))
        return reply[:i] + reply[i + 1 :]
    if mode == "swap-quotes":
        return reply.replace('"', "'", 1 + cut % 5)
    return reply.replace("title", "name", 1 + cut % 3)


@settings_(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 5000), mode=st.sampled_from(["cut", "drop-char", "swap-quotes", "rename"]),
       noise=st.text(max_size=40))
def test_any_mangled_answer_stores_offline_or_validated_labels(
    server: ScriptedOpenAIServer, cut: int, mode: str, noise: str
) -> None:
    """Whatever the reply, each topic ends with its offline labels or with values copied
    verbatim from the JSON the model returned for it — never noise, never a mixture."""
    replies: list[str] = []

    def mangled(body: dict[str, Any]) -> Behaviour:
        good = label_for(body).content or ""
        replies.append(_mangle(good, cut, mode))
        return answer(noise + replies[-1])

    server.reset()
    server.responder = mangled
    with llm_memory(server) as mem, Memory(":memory:", embedder=HashEmbedder(), settings=settings()) as offline:
        mem.add_many(items(), user_id="u")
        offline.add_many(items(), user_id="u")
        mem.organize("u")
        ref = {t.start_seq: t for t in offline.topics(user_id="u") if t.kind == "topic"}
        for t in mem.topics(user_id="u"):
            if t.kind != "topic":
                continue
            o = ref[t.start_seq]
            if (t.title, t.keywords, t.summary) == (o.title, o.keywords, o.summary):
                continue
            reply = replies[0]
            assert all(f'"{v}"' in reply for v in (t.title, t.summary, *t.keywords)), (t, reply)
            assert not ERROR_MARKERS.search(t.title + t.summary)


def test_plan_time_range_and_topic_choice_reach_the_context(server: ScriptedOpenAIServer) -> None:
    tax_day = (T0 + timedelta(days=2)).date().isoformat()

    def planner(body: dict[str, Any]) -> Behaviour:
        prompt = body["messages"][-1]["content"]
        # Pick the directory entry about the bicycle chain, by its handle.
        handle = next((m.group(1) for m in re.finditer(r"^(T\d+): .*$", prompt, re.M) if "chain" in m.group(0).lower()), None)
        return answer_json({"semantic_query": "open questions", "intent": "event",
                            "time_range": {"start": tax_day, "end": tax_day},
                            "needs_memory": True, "topic_ids": [handle] if handle else []})

    server.responder = planner
    with llm_memory(server) as mem:
        mem.add_many(items(), user_id="u")
        query = "remind me about that thing"  # no word in common with any exchange
        off = mem.recall(query, user_id="u", max_tokens=150, recent=0, use_llm=False)
        off_text = " ".join(e.text for e in off.exchanges)
        assert "chain" not in off_text and "tax" not in off_text  # offline ranking misses both
        rec = mem.recall(query, user_id="u", max_tokens=150, recent=0)
        note = next(n for n in rec.trace.notes if n.startswith("llm plan:"))
        assert f"time={tax_day}..{tax_day}" in note and "topics=1" in note
        texts = " ".join(e.text for e in rec.exchanges)
        assert "chain" in texts  # the plan's topic choice
        assert "tax" in texts  # the plan's time window
        assert rec.tokens <= 150


def test_writes_are_not_blocked_while_the_organiser_waits_for_the_model(server: ScriptedOpenAIServer, tmp_path) -> None:
    import threading
    import time

    server.responder = lambda body: slow(2.0, label_for(body))
    client = OpenAICompatibleLLM(server.url, "test-model", timeout=5, max_retries=0)
    with Memory(tmp_path / "m.db", embedder=HashEmbedder(), llm=client, settings=settings()) as mem:
        mem.add_many(items(), user_id="u")
        reports = []
        worker = threading.Thread(target=lambda: reports.append(mem.organize("u")))
        worker.start()
        time.sleep(0.2)  # the organiser is now waiting for the slow model
        t0 = time.perf_counter()
        ex = mem.begin("New question about piano pedals", user_id="u", session_id="s4")
        mem.complete(ex.id, "Use the sustain pedal sparingly.")
        elapsed = time.perf_counter() - t0
        worker.join()
        assert elapsed < 1.0, elapsed  # serialised behind the 2 s model call it would take >= 1.8 s
        assert reports[0].labelled == 4
        assert mem.get(ex.id).status == "completed"


def test_non_english_conversation_round_trips(server: ScriptedOpenAIServer) -> None:
    convo = [
        ("s0", "京都の紅葉はいつが見頃ですか？", "十一月の中旬から下旬が見頃です。"),
        ("s0", "嵐山にも行きたいです。", "朝早く行くと混雑を避けられます。"),
        ("s1", "Wie füttere ich meinen Sauerteig?", "Zweimal täglich mit Roggenmehl."),
        ("s2", "¿Cuándo vence la declaración de la renta?", "A finales de junio."),
    ]

    def labels(body: dict[str, Any]) -> Behaviour:
        prompt = body["messages"][-1]["content"]
        parts = re.split(r"^== (T\d+).*$", prompt, flags=re.M)
        out = []
        for handle, block in zip(parts[1::2], parts[2::2], strict=True):
            if "京都" in block:
                out.append({"id": handle, "title": "京都の紅葉旅行", "keywords": ["京都", "紅葉", "嵐山"],
                            "summary": "十一月に京都で紅葉を見る計画。"})
            else:
                out.append({"id": handle, "title": "Sauerteig füttern", "keywords": ["Sauerteig"],
                            "summary": "Zweimal täglich füttern."})
        return answer_json({"topics": out})

    server.responder = labels
    with llm_memory(server) as mem:
        mem.add_many([{"messages": [{"role": "user", "content": u}, {"role": "assistant", "content": a}],
                       "session_id": s, "at": (T0 + timedelta(hours=i)).isoformat()}
                      for i, (s, u, a) in enumerate(convo)], user_id="u")
        report = mem.organize("u")
        assert report.labelled == 2
        prompt = server.chat_requests[0].body["messages"][-1]["content"]
        assert "京都の紅葉はいつが見頃ですか？" in prompt and "Wie füttere ich meinen Sauerteig?" in prompt
        titles = {t.title for t in mem.topics(user_id="u") if t.kind == "topic"}
        assert {"京都の紅葉旅行", "Sauerteig füttern"} <= titles
        kyoto = next(t for t in mem.topics(user_id="u") if t.title == "京都の紅葉旅行")
        assert kyoto.keywords == ("京都", "紅葉", "嵐山") and kyoto.summary == "十一月に京都で紅葉を見る計画。"
