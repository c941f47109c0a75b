"""Theme summaries list their parts in conversation order (issue 19: the order followed the
database's row order, which depends on random ids, so identical builds differed)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from arbormem import Memory
from arbormem.text import shorten


def test_theme_summaries_follow_their_parts_in_order(tmp_path: Path) -> None:
    data = json.loads(resources.files("arbormem").joinpath("data/demo.json").read_text("utf-8"))
    with Memory(tmp_path / "m.db", embedder="hash") as m:
        m.add_many(data["exchanges"], user_id="u")
        themes = [t for t in m.tree(user_id="u").walk() if t.kind == "theme"]
        assert themes
        for theme in themes:
            recs = sorted(m.store.list_topics("u", parent_id=theme.id), key=lambda r: (r.start_seq or 0, r.id))
            assert len(recs) > 1
            assert theme.summary == shorten("; ".join(r.title for r in recs if r.title), 240)
