"""Terse conversations (docs/tree.md, "Terse conversations"): where the replies are a line each
(people chatting), a full message that links weakly to the open topic is left to the shift
head. Where the replies carry the subject (an assistant's), the rule still opens a topic:
test_follow_ups.py's switch ("He wants to book his theory test") is that case. Real MiniLM, a
real SQLite file."""

from __future__ import annotations

from pathlib import Path

import pytest

from arbormem import Memory
from arbormem.config import Settings, TreeSettings

# The start of a chit-chat dialogue of TIAGE's development split, annotated as one topic
# throughout (two people talking about their days, films and families). The fourth message has
# 16 words and links 0.16 to the open topic: the full-message rule alone would open a topic
# there (the head gives it 0.44, under its threshold).
CHAT = [
    ("hello what are doing today ?", "i am good , i just got off work and tired , i have two jobs ."),
    ("i just got done watching a horror movie", "i rather read , i have read about 20 books this year ."),
    ("wow ! i do love a good horror movie . loving this cooler weather", "but a good movie is always good ."),
    ("yes ! my son is in junior high and i just started letting him watch them too",
     "i work in the movies as well ."),
]


# The tree placement really builds (this package's conftest turns same-thread returns off).
pytestmark = pytest.mark.usefixtures("real_placement")


def _leaves(path: Path, minilm, tree: TreeSettings) -> list[str]:  # type: ignore[no-untyped-def]
    with Memory(path, embedder=minilm, settings=Settings(tree=tree)) as mem:
        added = mem.add_many([{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}],
                               "session_id": "chat"} for q, a in CHAT], user_id="u")
        topic_of = {e.id: e.topic_id for e in mem.exchanges(user_id="u")}
        return [topic_of[e.id] or "" for e in added]


def test_a_full_message_in_a_chat_of_short_lines_is_left_to_the_head(tmp_path, minilm) -> None:  # type: ignore[no-untyped-def]
    leaves = _leaves(tmp_path / "terse.db", minilm, TreeSettings())
    assert leaves[3] == leaves[2]
    # The same dialogue with the rules judging every conversation (terse_replies=0): the
    # full-message rule opens a topic at the son's horror films, where the annotators saw none.
    ruled = _leaves(tmp_path / "ruled.db", minilm, TreeSettings(terse_replies=0))
    assert ruled[3] != ruled[2]

