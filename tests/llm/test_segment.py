"""LLM re-segmentation of the open tail, against the real scripted OpenAI-compatible server."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from arbormem import Memory, Settings
from arbormem.embed.testing import HashEmbedder
from arbormem.llm import OpenAICompatibleLLM
from tests.support.openai_server import ScriptedOpenAIServer, answer, answer_json

T0 = datetime(2025, 1, 6, 9, 0, tzinfo=timezone.utc)
BREAD = ["My sourdough starter smells sour", "Feed it twice a day", "The loaf came out flat",
         "Proof it longer next time", "Can I use rye flour?", "Yes, rye makes it tangier",
         "How hot should the oven be?", "Bake at 250C with steam"]
BIKE = ["My bicycle chain keeps slipping", "Check the derailleur", "The brakes squeal too",
        "Clean the rims", "Which tyres for winter?", "Studded ones help on ice",
        "How often should I oil the chain?", "Every few hundred km"]


def memory(server: ScriptedOpenAIServer) -> Memory:
    s = Settings()
    s.tree.continue_threshold = 1.1  # offline placement opens a topic per exchange
    s.tree.reply_threshold = 1.1
    client = OpenAICompatibleLLM(server.url, "test-model", timeout=2.0, max_retries=0, backoff=0.01)
    return Memory(":memory:", embedder=HashEmbedder(), llm=client, settings=s)


def add_all(mem: Memory) -> None:
    lines = BREAD + BIKE
    for i in range(0, len(lines), 2):
        mem.add([{"role": "user", "content": lines[i]}, {"role": "assistant", "content": lines[i + 1]}],
                user_id="u", session_id="s", at=T0 + timedelta(minutes=i))


SEGMENTS: dict[str, Any] = {"topics": [
    {"start_seq": 1, "end_seq": 4, "status": "finalized", "label_terms": ["sourdough"]},
    {"start_seq": 5, "end_seq": 8, "status": "open", "label_terms": ["bicycle"]},
]}


def leaves(mem: Memory) -> list[Any]:
    return [t for t in mem.tree(user_id="u").walk() if t.kind == "topic"]


def test_segmentation_regroups_the_tail_and_keeps_the_tree_consistent(server: ScriptedOpenAIServer) -> None:
    server.responder = lambda body: answer_json(SEGMENTS)
    with memory(server) as mem:
        add_all(mem)
        assert len(leaves(mem)) == 8  # offline: one topic per exchange
        report = mem.organize("u", segment=True)
        seg = report.segmented
        assert seg is not None and seg.applied and seg.spans == 2 and seg.moved == 6 and seg.created == 0
        assert seg.finalized_through == 4
        exs = mem.exchanges(user_id="u")
        assert len({e.topic_id for e in exs[:4]}) == 1 and len({e.topic_id for e in exs[4:]}) == 1
        assert exs[0].topic_id != exs[4].topic_id
        tops = leaves(mem)
        assert len(tops) == 2 and sorted(t.size for t in tops) == [4, 4]
        bread = mem.topic(exs[0].topic_id, user_id="u")
        bike = mem.topic(exs[4].topic_id, user_id="u")
        assert bread.frozen and (bread.start_seq, bread.end_seq) == (1, 4)
        assert not bike.frozen and (bike.start_seq, bike.end_seq) == (5, 8)
        root = mem.tree(user_id="u")
        assert root.size == 8 and all(
            n.size == sum(c.size for c in n.children) for n in root.walk() if n.children)
        # Every topic is still findable, and the next exchange continues the open span's topic.
        assert mem.search("derailleur chain", user_id="u")[0].exchange.topic_id == bike.id
        assert any(c.action == "segment" for c in mem.store.list_changes("u"))
        # Nothing new since: the next run sends nothing (the finalized span is never resent).
        calls = mem.llm.total_calls
        assert mem.organize("u", segment=True, limit=0).segmented.llm_calls == 0  # type: ignore[union-attr]
        assert mem.llm.total_calls == calls


def test_bad_segmentation_leaves_placement_untouched(server: ScriptedOpenAIServer) -> None:
    bad = [answer("not json at all"),
           answer_json({"topics": [{"start_seq": 1, "end_seq": 3, "status": "open", "label_terms": ["x"]}]}),
           answer_json({"topics": [{"start_seq": 1, "end_seq": 8, "status": "finalized", "label_terms": ["x"]}]})]
    for behaviour in bad:
        server.responder = lambda body, b=behaviour: b
        with memory(server) as mem:
            add_all(mem)
            before = [(e.id, e.topic_id) for e in mem.exchanges(user_id="u")]
            tree_before = mem.tree(user_id="u")
            seg = mem.organize("u", segment=True, limit=0).segmented
            assert seg is not None and not seg.applied and seg.moved == 0
            assert [(e.id, e.topic_id) for e in mem.exchanges(user_id="u")] == before
            assert mem.tree(user_id="u") == tree_before
            assert mem.llm_log(failures_only=True)


def test_a_span_needing_a_new_topic_is_placed_by_the_router(server: ScriptedOpenAIServer) -> None:
    def responder(body: dict[str, Any]) -> Any:
        prompt = " ".join(str(m.get("content")) for m in body["messages"])
        if "continue_current" in prompt:
            return answer_json({"continue_current": False, "new_topic_title": "Bicycles", "parent_index": 0})
        return answer_json(SEGMENTS)

    server.responder = responder
    s = Settings()
    s.tree.continue_threshold = -1.0  # offline placement keeps the whole session in one topic
    s.tree.reply_threshold = -1.0
    client = OpenAICompatibleLLM(server.url, "test-model", timeout=2.0, max_retries=0, backoff=0.01)
    with Memory(":memory:", embedder=HashEmbedder(), llm=client, settings=s) as mem:
        add_all(mem)
        assert len(leaves(mem)) == 1
        theme = mem.topic(mem.exchanges(user_id="u")[0].topic_id, user_id="u").parent_id
        seg = mem.organize("u", segment=True, limit=0).segmented
        assert seg is not None and seg.applied and seg.created == 1 and seg.moved == 4
        exs = mem.exchanges(user_id="u")
        bike = mem.topic(exs[4].topic_id, user_id="u")
        assert bike.id != exs[0].topic_id and bike.parent_id == theme and bike.size == 4
        # One topic at the top level: no theme in the tail to route between, so no router call.
        assert sum(1 for r in server.requests if "continue_current" in str(r.body)) == 0
