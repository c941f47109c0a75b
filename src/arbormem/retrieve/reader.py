"""The exchanges one recall reads, each row fetched and tokenised at most once.

Scoring needs only an exchange's head (seq, session, topic, time, status); the coverage and
feedback stages and packing read a few dozen exchanges whole, mostly the same ones. One reader
per recall (or search) keeps both, so no stage fetches or tokenises a row another one already
did.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ..models import Exchange
from ..store.base import ExchangeFilter, ExchangeHead, Store
from ..text import index_tokens, term_counts


class ExchangeReader:
    """Heads and whole exchanges of ``user_id`` read so far (``rows``: id -> head or whole)."""

    def __init__(self, store: Store, user_id: str) -> None:
        self.store = store
        self.user_id = user_id
        self.rows: dict[str, Exchange | ExchangeHead] = {}
        self._tokens: dict[tuple[str, int], list[str]] = {}
        self._terms: dict[str, Counter[str]] = {}

    def heads(self, ids: Sequence[str]) -> None:
        """Read the heads of the ``ids`` not read yet (one query)."""
        missing = [i for i in ids if i not in self.rows]
        if missing:
            for h in self.store.exchange_heads(self.user_id, missing):
                self.rows[h.id] = h

    def full(self, ids: Sequence[str]) -> dict[str, Exchange]:
        """Whole exchanges for ``ids`` (in that order; unknown or deleted ones left out),
        replacing their heads (one query for those not read whole yet)."""
        missing = [i for i in ids if not isinstance(self.rows.get(i), Exchange)]
        if missing:
            for ex in self.store.get_exchanges(self.user_id, missing):
                self.rows[ex.id] = ex
        return {i: x for i in ids if isinstance(x := self.rows.get(i), Exchange)}

    def by_seq(self, seqs: Sequence[int], where: ExchangeFilter | None) -> list[ExchangeHead]:
        """Heads of the exchanges at these sequence numbers (not kept: the caller decides)."""
        return self.store.heads_by_seq(self.user_id, seqs, where) if seqs else []

    def index_tokens(self, ex_id: str, part: int) -> list[str]:
        """Index tokens of a read exchange's user (``part`` 0) or assistant (1) text."""
        key = (ex_id, part)
        toks = self._tokens.get(key)
        if toks is None:
            ex = self.rows[ex_id]
            assert isinstance(ex, Exchange)
            toks = self._tokens[key] = index_tokens(ex.assistant_text if part else ex.user_text)
        return toks

    def term_counts(self, ex_id: str) -> Counter[str]:
        """Term counts of a read exchange's text."""
        counts = self._terms.get(ex_id)
        if counts is None:
            ex = self.rows[ex_id]
            assert isinstance(ex, Exchange)
            counts = self._terms[ex_id] = term_counts(ex.text)
        return counts
