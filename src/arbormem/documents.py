"""Documents (CoMeT's ``add_document``): chunk a text and file the chunks like exchanges.

- **Chunking** keeps paragraphs whole when they fit ``max_chars``, splits longer ones at
  sentence boundaries (a sentence longer than the limit is cut at a space), packs units into
  chunks up to ``max_chars`` and repeats the tail of each chunk (whole sentences, up to
  ``overlap_chars``) at the start of the next, so a fact that straddles a cut is whole in one.
- **Storage**: through the one write path (``ingest.py``), each chunk becomes a completed exchange whose user message is
  ``[document: SOURCE · part i/n]`` + the chunk, so a recall that quotes it shows where it came
  from; ``metadata`` carries ``kind="document"``, ``source``, ``part``, ``parts`` and the
  content hashes. All chunks share a session id derived from the document hash, so the tree
  files them as their own topic(s) instead of gluing them onto the open conversation topic.
- **Deduplication across processes**: a chunk's key is the SHA-256 of its normalised text. The
  key is recorded as a per-user change-log row (``target_id = "dochash:<sha>"``, indexed by
  ``(user_id, target_id)`` in every store), checked and written inside the same
  ``store.transaction(user_id)`` that inserts the chunk, which serialises writers of a user
  across processes (SQLite ``BEGIN IMMEDIATE``, PostgreSQL advisory lock). A marker whose
  exchange was since deleted does not count, and ``delete_user`` removes the markers with the
  rest of the user's rows. Adding the same document twice adds nothing; adding a revised one
  adds only the chunks that changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import validate as v
from .errors import NotFoundError, ValidationError
from .models import Exchange, Serializable
from .organize.tree import new_id
from .text import sentences

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime

    from .ingest import Writer
    from .store.base import Store

_PARA = re.compile(r"\n\s*\n")
MARKER_PREFIX = "dochash:"
SOURCE_PREFIX = "docsrc:"
INDEXED_TARGET = "docsrc:indexed"  # this user's pre-version documents have markers


@dataclass(frozen=True)
class DocumentReport(Serializable):
    """What ``Memory.add_document`` did: the chunks stored now and those already present."""

    source: str
    doc_sha256: str
    chunks: int
    added: tuple[Exchange, ...]
    duplicates: tuple[str, ...]  # ids of this source's stored chunks kept as they were
    removed: tuple[str, ...] = ()  # ids of the previous version's chunks that went


def _split_long(text: str, max_chars: int) -> list[str]:
    out: list[str] = []
    for sent in sentences(text) or [text]:
        while len(sent) > max_chars:
            cut = sent.rfind(" ", 0, max_chars)
            cut = cut if cut > max_chars // 2 else max_chars
            out.append(sent[:cut].strip())
            sent = sent[cut:].strip()
        if sent:
            out.append(sent)
    return out


def chunk_text(text: str, *, max_chars: int = 1200, overlap_chars: int = 200) -> list[str]:
    """Split ``text`` into chunks of at most ``max_chars`` at paragraph/sentence boundaries,
    each starting with up to ``overlap_chars`` of the previous chunk's closing sentences."""
    if max_chars < 50:
        raise ValidationError("max_chars must be at least 50")
    if overlap_chars < 0 or overlap_chars >= max_chars // 2:
        raise ValidationError("overlap_chars must be between 0 and max_chars / 2")
    # Units: whole paragraphs when they fit, else their sentences. A paragraph break is kept
    # as a blank line inside a chunk so the stored text reads like the source.
    units: list[tuple[str, bool]] = []  # (text, starts a paragraph)
    for para in _PARA.split(text.replace("\r\n", "\n")):
        para = para.strip()
        if not para:
            continue
        pieces = [para] if len(para) <= max_chars else _split_long(para, max_chars - overlap_chars)
        units.extend((p, i == 0) for i, p in enumerate(pieces))
    chunks: list[str] = []
    cur: list[tuple[str, bool]] = []

    def joined(parts: list[tuple[str, bool]]) -> str:
        s = ""
        for i, (t, new_para) in enumerate(parts):
            s += t if i == 0 else ("\n\n" if new_para else " ") + t
        return s

    fresh = 0  # units in ``cur`` that are not overlap carried from the previous chunk
    for unit in units:
        if cur and len(joined([*cur, unit])) > max_chars:
            if fresh:
                chunks.append(joined(cur))
            # Carry whole trailing sentences of the finished chunk as the overlap.
            tail: list[tuple[str, bool]] = []
            for t, _ in reversed(_sentence_units(cur)):
                if len(t) + sum(len(x) + 1 for x, _ in tail) > overlap_chars:
                    break
                tail.insert(0, (t, False))
            cur, fresh = tail, 0
            while cur and len(joined([*cur, unit])) > max_chars:
                cur.pop(0)
        cur.append(unit)
        fresh += 1
    if cur and fresh:
        chunks.append(joined(cur))
    return chunks


def _sentence_units(parts: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    out: list[tuple[str, bool]] = []
    for t, p in parts:
        out.extend((s, p and i == 0) for i, s in enumerate(sentences(t) or [t]))
    return out


def _sha(text: str) -> str:
    return hashlib.sha256(" ".join(text.split()).encode("utf-8")).hexdigest()


# Long: one transaction (dedupe, replace the previous version, store the new chunks) that
# must read as one unit: a reader sees the old version or the new one, never both.
def add_document(
    writer: Writer, text: str, *, source: str, user_id: str, at: datetime | str | None = None,
    metadata: Mapping[str, Any] | None = None, max_chars: int = 1200, overlap_chars: int = 200,
) -> DocumentReport:
    """Chunk ``text`` and store new chunks as exchanges (see the module docstring)."""
    uid = v.user_id(user_id)
    _check_source(source)
    if not isinstance(text, str) or not text.strip():
        raise ValidationError("text is empty")
    if "\x00" in text:
        raise ValidationError("text contains a NUL character")
    when, extra = v.when(at), v.metadata(metadata)
    chunks = chunk_text(text, max_chars=max_chars, overlap_chars=overlap_chars)
    doc_sha = _sha(text)
    n = len(chunks)
    items: list[tuple[str, Exchange]] = []
    for i, chunk in enumerate(chunks, 1):
        h = _sha(chunk)
        body = f"[document: {source} · part {i}/{n}]\n{chunk}"
        meta = {**extra, "kind": "document", "source": source, "part": i, "parts": n,
                "content_sha256": h, "doc_sha256": doc_sha}
        ex = writer.prepare(uid, {"messages": [{"role": "user", "content": body}],
                                "session_id": f"doc:{doc_sha[:16]}", "at": when,
                                "metadata": meta}, i - 1)
        items.append((h, ex))

    store = writer.store

    def existing(h: str) -> str | None:
        # This source's chunk with this content: a document owns its chunks, so replacing
        # or deleting it never takes a chunk another source holds too.
        for change in store.list_changes(uid, target_id=MARKER_PREFIX + h, limit=100):
            ex_id = str(change.detail.get("exchange_id", ""))
            ex = store.get_exchange(ex_id) if ex_id else None
            if (ex is not None and ex.user_id == uid and ex.metadata.get("content_sha256") == h
                    and ex.metadata.get("source") == source):
                return ex.id
        return None

    unique: list[tuple[str, Exchange]] = []
    seen: set[str] = set()
    for h, ex in items:
        if h not in seen:
            seen.add(h)
            unique.append((h, ex))
    # Cheap pre-check so a re-added document embeds nothing; repeated inside the transaction,
    # which is what makes it safe against a concurrent writer.
    todo = [(h, ex) for h, ex in unique if existing(h) is None]
    vecs = dict(zip([h for h, _ in todo], writer.embed([ex.text for _, ex in todo]), strict=True))
    dupes: dict[str, str] = {}
    added: list[Exchange] = []
    with store.transaction(uid):
        kept: dict[str, str] = {}
        fresh: list[tuple[str, Exchange]] = []
        for h, ex in unique:
            found = existing(h)
            if found:
                kept[h] = found
            else:
                fresh.append((h, ex))
        # The previous version's chunks that the new one does not keep go first, through the
        # one deletion path (tree, vectors, full text, statistics), in this transaction: a
        # reader sees the old version or the new one, never both.
        removed = [x for x in _current_ids(store, uid, source) if x not in set(kept.values())]
        for old in store.get_exchanges(uid, removed):
            writer.delete(old)
        missing = [(h, ex) for h, ex in fresh if h not in vecs]  # a chunk deleted meanwhile
        if missing:
            vecs.update(zip([h for h, _ in missing], writer.embed([ex.text for _, ex in missing]), strict=True))
        unit = writer.unit(uid)
        for h, ex in fresh:
            ex = unit.add(dataclasses.replace(ex, id=new_id("x"), seq=store.next_seq(uid)), vecs[h])
            store.log_change(uid, "document_chunk", MARKER_PREFIX + h, {"exchange_id": ex.id, "source": source})
            added.append(ex)
            kept[h] = ex.id
        unit.finish()
        dupes = {h: x for h, x in kept.items() if x not in {e.id for e in added}}
        store.log_change(uid, "document", _source_key(source),
                         {"source": source, "doc_sha256": doc_sha, "ids": [kept[h] for h, _ in unique]})
        if removed:
            store.purge_deleted_text()
    return DocumentReport(source=source, doc_sha256=doc_sha, chunks=n, added=tuple(added),
                          duplicates=tuple(dupes.values()), removed=tuple(removed))


def _source_key(source: str) -> str:
    """Change-log target of a source's current version (its chunk ids, in order)."""
    return SOURCE_PREFIX + hashlib.sha256(source.encode("utf-8")).hexdigest()


def _current_ids(store: Store, uid: str, source: str) -> list[str]:
    """The chunk ids of ``source``'s current version (call inside the user's transaction).

    Documents added before versions were recorded have no marker: the first call for a user
    scans the user's exchanges once, records a marker for every such source and a
    ``docsrc:indexed`` mark, so no later call scans again."""
    for change in store.list_changes(uid, target_id=_source_key(source), limit=1):
        ids = change.detail.get("ids")
        return [str(i) for i in ids] if isinstance(ids, list) else []
    if store.list_changes(uid, target_id=INDEXED_TARGET, limit=1):
        return []
    found: dict[str, list[str]] = {}
    for ex in store.iter_exchanges(uid):
        src = ex.metadata.get("source")
        if ex.metadata.get("kind") == "document" and isinstance(src, str):
            found.setdefault(src, []).append(ex.id)
    for src, ids in found.items():
        store.log_change(uid, "document", _source_key(src), {"source": src, "doc_sha256": None, "ids": ids})
    store.log_change(uid, "document_index", INDEXED_TARGET, {"sources": len(found)})
    return found.get(source, [])


def delete_document(writer: Writer, source: str, *, user_id: str) -> tuple[str, ...]:
    """Delete every chunk of ``source`` (its current version) in one transaction; returns
    their ids. NotFoundError when the user holds no document under that source."""
    uid = v.user_id(user_id)
    _check_source(source)
    store = writer.store
    with store.transaction(uid):
        ids = _current_ids(store, uid, source)
        gone = store.get_exchanges(uid, ids)
        if not gone:
            raise NotFoundError(f"no document with source {source!r}")
        for ex in gone:
            writer.delete(ex)
        store.log_change(uid, "document", _source_key(source), {"source": source, "doc_sha256": None, "ids": []})
        store.purge_deleted_text()
    return tuple(ex.id for ex in gone)


def _check_source(source: object) -> None:
    if not isinstance(source, str) or not source.strip() or len(source) > 1000:
        raise ValidationError("source must be a non-empty string of at most 1000 characters")
    v.item_id(source[:256], "source")  # valid Unicode, no NUL


__all__ = ["DocumentReport", "add_document", "delete_document", "chunk_text"]
