"""Theme summaries list their parts in conversation order (issue 19: the order followed the
database's row order, which depends on random ids, so identical builds differed)."""

from __future__ import annotations

from pathlib import Path

from arbormem import Memory
from arbormem.eval.locomo import load_conversations
from arbormem.eval.runner import ingest_conversation
from arbormem.text import shorten

DATA = Path(__file__).resolve().parents[1] / "eval" / "data"


def test_theme_summaries_follow_their_parts_in_order(tmp_path: Path) -> None:
    files = sorted(DATA.glob("*.json"))
    assert files
    with Memory(tmp_path / "m.db", embedder="hash") as m:
        for conv in load_conversations([str(f) for f in files]):
            ingest_conversation(m, conv, "u")
        themes = [t for t in m.tree(user_id="u").walk() if t.kind == "theme"]
        assert themes
        for theme in themes:
            recs = sorted(m.store.list_topics("u", parent_id=theme.id),
                          key=lambda r: (r.start_seq or 0, r.created_seq, r.title))
            assert theme.summary == shorten("; ".join(r.title for r in recs if r.title), 240)
