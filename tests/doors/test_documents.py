"""Documents: chunking at boundaries with overlap, dedupe by content hash across processes,
chunks filed into the tree and recalled with their source."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arbormem import Memory, ValidationError
from arbormem.documents import chunk_text
from arbormem.text import sentences

HANDBOOK = "\n\n".join([
    "Onboarding handbook. Welcome to the team.",
    " ".join(f"Security rule {i}: rotate the badge code every {i + 2} weeks." for i in range(20)),
    "Expenses. Submit receipts within 30 days. Travel is booked through the portal.",
    " ".join(f"Holiday fact {i}: the office closes on day {i + 10} of the winter break." for i in range(20)),
])


def test_chunks_respect_boundaries_limits_and_overlap() -> None:
    chunks = chunk_text(HANDBOOK, max_chars=400, overlap_chars=120)
    assert len(chunks) >= 5 and all(len(c) <= 400 for c in chunks)
    # Every chunk ends at a sentence end, and every sentence of the source is in some chunk.
    assert all(c.rstrip()[-1] in ".!?" for c in chunks)
    for sent in sentences(HANDBOOK.replace("\n\n", " ")):
        assert any(sent in c for c in chunks), sent
    # Consecutive chunks inside one paragraph share the previous chunk's last sentence.
    shared = sum(1 for a, b in zip(chunks, chunks[1:], strict=False) if sentences(a)[-1] in b)
    assert shared >= 3
    # Paragraphs that fit stay whole.
    assert "Expenses. Submit receipts within 30 days. Travel is booked through the portal." in "\n".join(chunks)
    with pytest.raises(ValidationError):
        chunk_text("x", max_chars=10)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="abc xyz.!?\n", min_size=1, max_size=300), min_size=1, max_size=8))
def test_chunking_never_exceeds_the_limit_or_loses_words(parts: list[str]) -> None:
    text = "\n\n".join(parts)
    chunks = chunk_text(text, max_chars=120, overlap_chars=30)
    assert all(0 < len(c) <= 120 for c in chunks)
    assert set(text.split()) <= set(" ".join(chunks).split())


def test_add_document_files_chunks_and_recalls_them_with_source(tmp_path: Path) -> None:
    with Memory(tmp_path / "d.db", embedder="hash") as mem:
        mem.add([{"role": "user", "content": "Hi, I'm new here"}, {"role": "assistant", "content": "Welcome!"}],
                user_id="u", session_id="chat")
        rep = mem.add_document(HANDBOOK, source="handbook.md", user_id="u", max_chars=400, overlap_chars=120)
        assert rep.chunks == len(rep.added) >= 5 and rep.duplicates == ()
        ex = rep.added[0]
        assert ex.metadata["source"] == "handbook.md" and ex.metadata["kind"] == "document"
        assert ex.metadata["part"] == 1 and ex.metadata["parts"] == rep.chunks
        assert ex.user_text.startswith("[document: handbook.md · part 1/")
        # Chunks get their own topic(s): never glued onto the open chat topic.
        chat_topic = mem.exchanges(user_id="u")[0].topic_id
        assert all(e.topic_id and e.topic_id != chat_topic for e in rep.added)
        r = mem.recall("How long do I have to submit receipts for expenses?", user_id="u", max_tokens=300)
        assert "Submit receipts within 30 days" in r.text and "[document: handbook.md" in r.text

        again = mem.add_document(HANDBOOK, source="handbook.md", user_id="u", max_chars=400, overlap_chars=120)
        assert again.added == () and sorted(again.duplicates) == sorted(e.id for e in rep.added)
        revised = HANDBOOK + "\n\nNew section. Parking permits are renewed every March."
        rev = mem.add_document(revised, source="handbook.md", user_id="u", max_chars=400, overlap_chars=120)
        # The revision replaces the previous version: unchanged chunks kept, the rest gone.
        assert 1 <= len(rev.added) <= 2 and len(rev.duplicates) >= rep.chunks - 1
        assert len(rev.removed) == rep.chunks - len(rev.duplicates)
        held = [e for e in mem.exchanges(user_id="u") if e.metadata.get("source") == "handbook.md"]
        assert len(held) == rev.chunks
        # A deleted chunk is no longer a duplicate; another user has their own copy.
        mem.delete(rev.added[0].id)
        assert len(mem.add_document(revised, source="handbook.md", user_id="u", max_chars=400,
                                    overlap_chars=120).added) == 1
        assert len(mem.add_document(HANDBOOK, source="handbook.md", user_id="v", max_chars=400,
                                    overlap_chars=120).added) == rep.chunks
        mem.delete_user("u")
        assert len(mem.add_document(HANDBOOK, source="h", user_id="u", max_chars=400,
                                    overlap_chars=120).added) == rep.chunks
        for bad in ({"source": ""}, {"source": "x" * 2000}):
            with pytest.raises(ValidationError):
                mem.add_document(HANDBOOK, user_id="u", **bad)  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            mem.add_document("  ", source="s", user_id="u")


SCRIPT = """
import sys
from arbormem import Memory
text = open(sys.argv[2], encoding="utf-8").read()
with Memory(sys.argv[1], embedder="hash") as mem:
    rep = mem.add_document(text, source="shared.md", user_id="u", max_chars=300, overlap_chars=80)
    print(len(rep.added), len(rep.duplicates))
"""


def test_dedupe_holds_across_concurrent_processes(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    Memory(db, embedder="hash").close()  # create the schema once
    doc = tmp_path / "doc.txt"
    doc.write_text(HANDBOOK, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, str(db), str(doc)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    added = [int(o[0].split()[0]) for o in outs]
    n = len(chunk_text(HANDBOOK, max_chars=300, overlap_chars=80))
    assert sum(added) == n  # every chunk stored exactly once, whichever process won it
    with Memory(db, embedder="hash") as mem:
        stored = mem.exchanges(user_id="u")
        assert len(stored) == n and len({e.metadata["content_sha256"] for e in stored}) == n


def test_a_document_added_before_versions_is_replaced_too(tmp_path: Path) -> None:
    """Memories made before sources were versioned: the first add of a user scans once and
    records every old source, so the old chunks go when the source is added again."""
    db = tmp_path / "old.db"
    with Memory(db, embedder="hash") as mem:
        old = mem.add_document(HANDBOOK, source="handbook.md", user_id="u", max_chars=400, overlap_chars=120)
        mem.add_document("Another doc. It stays.", source="other.md", user_id="u")
    with sqlite3.connect(db) as conn:  # as an earlier version left them: no version markers
        conn.execute("DELETE FROM changes WHERE target_id LIKE 'docsrc:%'")
    with Memory(db, embedder="hash") as mem:
        first = mem.add_document("Unrelated notes. Nothing else.", source="notes.md", user_id="u")
        assert first.removed == ()
        assert len(mem.store.list_changes("u", target_id="docsrc:indexed")) == 1
        new = mem.add_document(HANDBOOK + "\n\nAppendix. Parking is free.", source="handbook.md", user_id="u",
                               max_chars=400, overlap_chars=120)
        assert new.removed and set(new.removed) <= {e.id for e in old.added}
        held = [e for e in mem.exchanges(user_id="u") if e.metadata.get("source") == "handbook.md"]
        assert len(held) == new.chunks
        assert len(mem.delete_document("other.md", user_id="u")) == 1
        assert len(mem.store.list_changes("u", target_id="docsrc:indexed")) == 1  # scanned once
