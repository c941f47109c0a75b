"""parse_reply: accept fenced/chatty JSON, repair only the unambiguous, reject the rest."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arbormem.llm.roles import QueryPlan, TopicLabel
from arbormem.llm.validate import InvalidOutput, extract_json_objects, parse_reply

GOOD = {"title": "Sourdough starter", "keywords": ["flour", "hydration"], "summary": "Feeding a starter."}


@pytest.mark.parametrize(
    "reply",
    [
        json.dumps(GOOD),
        "```json\n" + json.dumps(GOOD, indent=2) + "\n```",
        "```\n" + json.dumps(GOOD) + "\n```",
        "Sure, here it is:\n" + json.dumps(GOOD) + "\nAnything else?",
        "<think>The user talks about bread, so...</think>\n" + json.dumps(GOOD),
        json.dumps(GOOD)[:-1] + ",}",  # trailing comma
        '{"title": "Sourdough starter", "keywords": ["flour", "hydration",], "summary": "Feeding a starter."}',
        json.dumps(GOOD)[:-1],  # forgot the last brace after a complete string
        "\ufeff" + json.dumps(GOOD),
        # the same object twice (fence + echo) is one answer, not two
        "```json\n" + json.dumps(GOOD) + "\n```\nAgain: " + json.dumps(GOOD),
    ],
    ids=["plain", "fenced", "bare-fence", "chatty", "think", "trailing-comma", "trailing-comma-list",
         "missing-brace", "bom", "repeated"],
)
def test_accepts_and_repairs(reply: str) -> None:
    label = parse_reply(reply, TopicLabel)
    assert label.title == "Sourdough starter"
    assert label.keywords == ["flour", "hydration"]
    assert label.summary == "Feeding a starter."


@pytest.mark.parametrize(
    "reply, reason",
    [
        ("", "empty"),
        ("I'm sorry, but I can't help with that.", "no JSON"),
        ('{"title": "Sourdough starter", "keywords": ["flour", "hydr', "no JSON"),  # cut mid-string
        ('{"title": "Sourdough starter", "keywords": ["flour"], "summary": "Feeding a starter.", "n": 12',
         "no JSON"),  # a cut number is ambiguous (12 or 120?)
        ('{"title": "Sourdough starter", "keywords": ["flour"], "summary":', "no JSON"),  # after a colon
        ('{"title": "Bread", "keywords": ["flour"]}', "does not match"),  # missing summary
        ('{"title": 3, "keywords": "flour", "summary": "x"}', "does not match"),  # wrong types
        ("{'title': 'Bread', 'keywords': ['flour'], 'summary': 'x'}", "no JSON"),  # python quotes
        ('{"title": "<short title>", "keywords": ["flour"], "summary": "x"}', "does not match"),
        ('{"title": "A", "keywords": ["a"], "summary": "x"} or {"title": "B", "keywords": ["b"], "summary": "y"}',
         "different valid answers"),
        ('{"title": "Bread", "keywords": ["flour"], "summary": NaN}', "no JSON"),
        ("<think>still thinking about it", "unfinished"),
        ('{"title": "Bread", "keywords": [], "summary": "x"}', "does not match"),
        ('{"title": "Bre\\u0000ad", "keywords": ["k"], "summary": "x"}', "does not match"),  # escaped NUL
        ('{"title": "Bre\u0000ad", "keywords": ["k"], "summary": "x"}', "no JSON"),  # raw NUL
    ],
)
def test_rejects(reply: str, reason: str) -> None:
    with pytest.raises(InvalidOutput, match=reason):
        parse_reply(reply, TopicLabel)


def test_extra_keys_are_ignored_but_lists_are_cleaned() -> None:
    reply = json.dumps({**GOOD, "keywords": ["Flour", "flour ", " hydration", "x" * 10], "confidence": 0.9})
    label = parse_reply(reply, TopicLabel)
    assert label.keywords == ["Flour", "hydration", "x" * 10]


def test_blank_optional_field_means_null() -> None:
    q = parse_reply('{"semantic_query": "trip to Kyoto", "intent": "event", "time_range": ""}', QueryPlan)
    assert q.time_range is None and q.intent == "event"


def test_non_latin_text_round_trips() -> None:
    obj = {"title": "京都旅行の計画", "keywords": ["京都", "旅館"], "summary": "秋の京都旅行を計画した。"}
    label = parse_reply("```json\n" + json.dumps(obj, ensure_ascii=False) + "\n```", TopicLabel)
    assert label.title == "京都旅行の計画" and label.keywords == ["京都", "旅館"]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_never_raises_anything_but_invalid_output(text: str) -> None:
    try:
        parse_reply(text, TopicLabel)
    except InvalidOutput:
        pass


@settings(max_examples=100, deadline=None)
@given(
    title=st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=40).filter(
        lambda s: s.strip() and not s.strip().startswith("<")
    ),
    prefix=st.sampled_from(["", "Here you go:\n", "```json\n"]),
)
def test_wrapping_does_not_change_the_answer(title: str, prefix: str) -> None:
    obj = {"title": title, "keywords": ["k"], "summary": "s"}
    suffix = "\n```" if prefix.startswith("```") else ""
    try:
        plain = parse_reply(json.dumps(obj, ensure_ascii=False), TopicLabel)
    except InvalidOutput:
        return  # a placeholder-like title is rejected either way
    wrapped = parse_reply(prefix + json.dumps(obj, ensure_ascii=False) + suffix, TopicLabel)
    assert wrapped == plain


def test_extract_finds_objects_in_order() -> None:
    objs = extract_json_objects('a {"x": 1} b {"y": [1, 2]} c')
    assert objs == [{"x": 1}, {"y": [1, 2]}]
