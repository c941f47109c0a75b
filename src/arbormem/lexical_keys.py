"""Lexical-key expansion: what the exchange full-text index holds for each exchange.

An exchange's lexical key is its own text plus the text of its neighbours in the same session
(LongMemEval's key expansion; the value packed into a recall stays verbatim). A reply often
only makes sense with the question before it: on the development split this raised
recall@10 of the ranking by ~1-2 points. Neighbours change when an exchange arrives or is
deleted, so their entries are rewritten then (``ingest.py``). Only placed neighbours count:
an exchange queued for background placement (completed, no topic yet; ``backlog.py``) has no
entry and is quoted by none until it is placed, when its neighbours' entries are rewritten, so
the keys end as inline placement leaves them and deleting a queued exchange leaves none of its
text behind in a neighbour's entry.
"""

from __future__ import annotations

from collections.abc import Sequence

from .models import Exchange
from .store.base import Store


def lexical_key(ex: Exchange, before: Exchange | None, after: Exchange | None) -> str:
    """The full-text entry of ``ex`` given its neighbours by sequence number (either None)."""
    parts = [ex.text]
    for nb in (before, after):
        if nb is not None and _placed(nb) and nb.session_id == ex.session_id:
            parts.append(nb.text)
    return "\n".join(parts)


def _placed(ex: Exchange) -> bool:
    return ex.status == "completed" and ex.topic_id is not None


def write_lexical_keys(store: Store, user_id: str, seqs: Sequence[int], known: dict[int, Exchange]) -> None:
    """Rewrite the full-text entries of the user's exchanges at ``seqs`` (``known``: exchanges
    the caller holds already, by seq; the missing neighbours are read, and added to it)."""
    need = sorted({s + d for s in seqs for d in (-1, 0, 1) if s + d > 0} - set(known))
    if need:
        for e in store.exchanges_by_seq(user_id, need):
            known.setdefault(e.seq, e)
    for s in seqs:
        ex = known.get(s)
        if ex is None or not _placed(ex):
            continue
        store.put_text(user_id, "exchange", ex.id, lexical_key(ex, known.get(s - 1), known.get(s + 1)))


__all__ = ["lexical_key", "write_lexical_keys"]
