"""Junk that has the right JSON shape is still junk (issue 23): titles, keywords and summaries
that echo the prompt, name its handles or markers, hold JSON or markup fragments, state
numbers or months the topic never mentions, or name no subject are rejected. Every reply here
comes from a real fixed-reply OpenAI-compatible endpoint on loopback."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given
from hypothesis import settings as settings_
from hypothesis import strategies as st

from arbormem import Memory
from arbormem.embed.testing import HashEmbedder
from arbormem.llm import LLMRunner, OpenAICompatibleLLM
from arbormem.llm.prompts import LABEL_BATCH_SYSTEM, Turn
from arbormem.llm.roles import label_topic, label_topics, route
from arbormem.llm.validate import GENERIC_TITLES, Grounding
from tests.llm.test_memory_llm import items, settings
from tests.support.openai_server import ScriptedOpenAIServer, answer_json

AT = datetime(2025, 3, 9, 9, 18, tzinfo=timezone.utc)
TURNS = [
    Turn(1, "My dog Biscuit has a vet visit on June 14th for his vaccines.", "Bring his booklet to the clinic.", AT),
    Turn(2, "He is scared of the car ride.", "A blanket that smells of home helps.", AT),
]

#: The five accepted by the old validation (issue 23), and what the real SmolLM2 proposed.
JUNK_TITLES = [
    "T1",
    '{"id": 1, "title": "Biscuit"',
    "2 to 8 words naming the specific subject",
    "<<<DATA",
    "chat",
    "T2",
    "Race done: 2025-03-09 09:18",
    "Biscuit vet visit on June 23rd",
    "My dog Biscuit has a vet visit on June 14th for his vaccines.",  # a whole message
]


@pytest.fixture(scope="module")
def fixed() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer() as srv:
        yield srv


def runner_for(server: ScriptedOpenAIServer) -> LLMRunner:
    # failure_ttl=0: these tests send one prompt with many different replies
    return LLMRunner(OpenAICompatibleLLM(server.url, "m", timeout=2, max_retries=0), failure_ttl=0)


def reply_with(server: ScriptedOpenAIServer, **fields: Any) -> None:
    label = {"id": "T1", "title": "Biscuit vet visit", "keywords": ["Biscuit", "vet"],
             "retrieval_terms": ["dog vaccination"], "trigger": "When the user plans a vet visit.",
             "summary": "Biscuit has a vet visit on June 14th for his vaccines.", **fields}
    server.responder = lambda body: answer_json({"topics": [label]})


def label(server: ScriptedOpenAIServer, **fields: Any) -> Any:
    reply_with(server, **fields)
    result = label_topics(runner_for(server), [("t_dog", TURNS)])
    return None if result is None else result.labels.get("t_dog")


def test_a_grounded_label_passes(fixed: ScriptedOpenAIServer) -> None:
    got = label(fixed)
    assert got is not None and got.title == "Biscuit vet visit" and "June 14th" in got.summary


@pytest.mark.parametrize("title", JUNK_TITLES)
def test_the_junk_titles_are_rejected(fixed: ScriptedOpenAIServer, title: str) -> None:
    assert label(fixed, title=title) is None


@pytest.mark.parametrize("summary", [
    "1 to 3 sentences stating the facts, decisions and open questions of the topic.",
    "Biscuit sees the vet on June 23rd.",       # a date the text does not hold
    "Biscuit sees the vet in March.",            # a month the text does not name (the header's)
    'Biscuit sees the vet. "keywords": ["vet"]',
    "Biscuit sees the vet <<<DATA",
])
def test_junk_summaries_are_rejected(fixed: ScriptedOpenAIServer, summary: str) -> None:
    assert label(fixed, summary=summary) is None


def test_junk_keywords_and_terms_are_dropped_not_stored(fixed: ScriptedOpenAIServer) -> None:
    got = label(fixed, keywords=["Biscuit", "T1", "<<<DATA", "2025"], retrieval_terms=["vet", "short keywords or names"],
                trigger="2 to 8 words naming the specific subject")
    assert got is not None
    assert got.keywords == ["Biscuit"] and got.retrieval_terms == ["vet"] and got.trigger is None
    assert label(fixed, keywords=["T1", "{", "chat"]) is None  # nothing left: the label goes


def test_single_topic_labels_and_router_titles_are_checked_too(fixed: ScriptedOpenAIServer) -> None:
    runner = runner_for(fixed)
    fixed.responder = lambda body: answer_json({"title": "T1", "keywords": ["Biscuit"], "summary": "Biscuit."})
    assert label_topic(runner, TURNS) is None
    fixed.responder = lambda body: answer_json({"continue_current": False, "new_topic_title": "<<<DATA",
                                                "parent_index": None})
    assert route(runner, None, [], TURNS[:1], TURNS[1]) is None
    fixed.responder = lambda body: answer_json({"continue_current": False, "new_topic_title": "Car ride fear",
                                                "parent_index": None})
    decision = route(runner, None, [], TURNS[:1], TURNS[1])
    assert decision is not None and decision.new_topic_title == "Car ride fear"


# -- properties ------------------------------------------------------------------------------------
SOURCE = "\n".join(f"{t.user}\n{t.assistant}" for t in TURNS)
PROMPT_WORDS = re.findall(r"\w+", LABEL_BATCH_SYSTEM.casefold())
#: Words of the topic that the prompt does not use, digits and generic words aside.
SAFE_WORDS = sorted({w for w in re.findall(r"[^\W\d_]+", SOURCE)
                     if w.casefold() not in set(PROMPT_WORDS) and w.casefold() not in GENERIC_TITLES})
# Runs of three or more words of the prompt's own wording that the topic does not hold.
PROMPT_RUNS = [" ".join(PROMPT_WORDS[i:i + n]) for n in (3, 4, 6) for i in range(len(PROMPT_WORDS) - n)
               if " ".join(PROMPT_WORDS[i:i + n]) not in " ".join(re.findall(r"\w+", SOURCE.casefold()))]

fragments = st.one_of(
    st.integers(1, 99).map(lambda n: f"T{n}"),                                   # handles
    st.sampled_from(["<<<DATA", "DATA>>>", "<<<", ">>>"]),                        # markers
    st.sampled_from(['{"id": 1', '"title": "x"', "[", "]", "{", "}", '"summary":']),  # JSON
    st.sampled_from(["<b>", "</p>", "<br/>", "```", "<think>"]),                   # markup
    st.sampled_from(PROMPT_RUNS),                                                 # prompt echo
    st.integers(15, 10**6).filter(lambda n: n not in {14}).map(str),             # absent numbers
    st.sampled_from(["March", "January", "Sept"]),                                # absent months
)
safe = st.lists(st.sampled_from(SAFE_WORDS), min_size=0, max_size=3).map(" ".join)


@settings_(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=safe, junk=fragments, after=safe)
def test_a_title_holding_any_junk_fragment_is_rejected(fixed: ScriptedOpenAIServer, before: str, junk: str,
                                                         after: str) -> None:
    title = " ".join(p for p in (before, junk, after) if p)
    assert label(fixed, title=title) is None, title


@settings_(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(st.sampled_from(SAFE_WORDS), min_size=1, max_size=6, unique=True))
def test_a_title_of_the_topics_own_words_passes(fixed: ScriptedOpenAIServer, words: list[str]) -> None:
    title = " ".join(words)
    got = label(fixed, title=title)
    assert got is not None and got.title == title


@settings_(max_examples=200, deadline=None)
@given(text=st.text(min_size=1, max_size=60))
def test_grounding_never_passes_a_handle_marker_or_json_key(text: str) -> None:
    ground = Grounding(SOURCE, LABEL_BATCH_SYSTEM)
    for junk in ("T3", "<<<DATA", '"title":', "{"):
        assume(junk not in SOURCE)
        assert ground.junk(text + junk, "title") is not None
        assert ground.junk(junk + text, "sentence") is not None


def test_no_stored_title_holds_a_handle_marker_or_json(fixed: ScriptedOpenAIServer) -> None:
    """Through Memory.organize: a model answering only junk leaves the offline tree."""
    junk = iter(JUNK_TITLES * 10)

    def responder(body: dict[str, Any]) -> Any:
        user = body["messages"][-1]["content"]
        handles = re.findall(r"^== (T\d+)", user, re.M)
        return answer_json({"topics": [{"id": h, "title": next(junk), "keywords": ["k"], "summary": "Fine."}
                                       for h in handles]})

    fixed.responder = responder
    llm = OpenAICompatibleLLM(fixed.url, "m", timeout=2, max_retries=0)
    with Memory(":memory:", embedder=HashEmbedder(), llm=llm, settings=settings()) as mem:
        mem.add_many(items(), user_id="u")
        report = mem.organize("u")
        assert report.labelled == 0 and report.failed == report.candidates > 0
        for t in mem.topics(user_id="u"):
            assert not re.search(r"\bT\d+\b|<<<|DATA>>>|[{}\[\]]|\"\w+\":", t.title + " " + t.summary), t
