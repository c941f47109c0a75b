"""Speaker focus: in a chat between named people, a question that names one of them gets only
that person's lines from the exchanges below the best ones (retrieve/engine.py `_speaker_focus`);
everything else is packed whole, as before."""

from __future__ import annotations

from pathlib import Path

from arbormem import Memory
from arbormem.config import RecallSettings, Settings
from arbormem.embed.testing import HashEmbedder
from arbormem.eval.runner import count_tokens
from arbormem.render import render_exchange
from tests.conftest import chat

HOBBIES = ["pottery", "climbing", "chess", "sailing", "baking", "cycling", "painting", "birdwatching"]


def _pair(i: int, hobby: str) -> list[dict[str, str]]:
    return [{"role": "user", "name": "Ben", "content": f"Ben question {i}: what did you do this week?"},
            {"role": "assistant", "name": "Ana", "content": f"Ana here: I spent the week on {hobby}, my hobby."}]


def _memory(path: Path, **recall: object) -> Memory:
    mem = Memory(path, embedder=HashEmbedder(), settings=Settings(recall=RecallSettings(**recall)))
    if not mem.exchanges(user_id="u", limit=1):
        mem.add_many([{"messages": _pair(i, h), "session_id": f"s{i}"} for i, h in enumerate(HOBBIES)]
                     + [{"messages": chat("Unrelated note about taxes.", "Filed.")}], user_id="u")
    return mem


def test_lower_ranked_exchanges_show_only_the_named_speakers_lines(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    budget, share = 2000, 0.05
    with _memory(path, speaker_focus_share=share) as mem:
        r = mem.recall("Which hobby does Ana have?", user_id="u", max_tokens=budget, recent=0)
    assert r.tokens <= budget
    hobby_exchanges = [e for e in r.exchanges if "Ana here" in e.assistant_text]
    assert len(hobby_exchanges) == len(HOBBIES)  # every one packed
    by_score = sorted(hobby_exchanges, key=lambda e: -r.trace.exchange_scores[e.id])
    whole = [ex.messages[0]["content"] in r.text for ex in by_score]
    for ex in by_score:
        assert f"Ana: {ex.messages[1]['content']}" in r.text  # the named person's line, always
    # The best exchanges stay whole until they have taken `share` of the budget; the rest
    # show Ana's lines only.
    n = whole.index(False)
    assert 1 <= n < len(by_score) and not any(whole[n:])
    costs = [count_tokens(render_exchange(ex)) + 1 for ex in by_score[:n]]
    assert sum(costs[:-1]) < share * budget <= sum(costs)
    assert r.trace.notes == ("lines of Ana only, below the best exchanges",)


def test_whole_exchanges_when_off_when_both_are_named_and_in_plain_chats(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    with _memory(path, speaker_focus=False) as mem:
        off = mem.recall("Which hobby does Ana have?", user_id="u", max_tokens=2000, recent=0)
    with _memory(path) as mem:
        both = mem.recall("What did Ben ask Ana about her hobby?", user_id="u", max_tokens=2000, recent=0)
        plain = mem.recall("What about taxes?", user_id="u", max_tokens=2000, recent=0)
    for r in (off, both):
        assert all(f"Ben: {e.messages[0]['content']}" in r.text for e in r.exchanges if e.messages[0].get("name"))
        assert not any(n.startswith("lines of") for n in r.trace.notes)
    assert "user: Unrelated note about taxes.\nassistant: Filed." in plain.text


def test_a_name_is_matched_by_its_words_or_their_start() -> None:
    from arbormem.retrieve.pack import names as _names

    assert _names("Melanie", {"mel", "kids"})          # a nickname: the start of the name
    assert _names("Mary Ann", {"ann"}) and _names("Jon", {"jon"})
    assert not _names("Melanie", {"me", "kids"})       # two letters are not a nickname
    assert not _names("Ana", {"banana"}) and not _names("Ana", set())
