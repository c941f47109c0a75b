"""The exchanges one recall reads, each row fetched and tokenised at most once.

Scoring needs only an exchange's head (seq, session, topic, time, status); the coverage and
feedback stages read the words of a few dozen exchanges (``texts``: no messages or metadata
to decode), and packing reads fewer whole. One reader per recall (or search) keeps all three,
so no stage fetches a row another one already did. The words come from the tokens the store
kept when the exchange was written (``text.token_record``); for rows without them
tokenising a text is a pure function of the text, cached for the process (``_TEXT_CACHE``
texts, each way): recalls on one memory read the same exchanges again and again, and
tokenising them was most of what those steps cost.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Mapping, Sequence

from ..models import Exchange, exchange_text
from ..store.base import ExchangeFilter, ExchangeHead, ExchangeText, Store
from ..text import index_tokens, term_counts

#: Texts whose tokens are kept (per kind). Recalls on one memory touch most of its exchanges
#: over a few hundred queries (200 queries on the synthetic 10k bench memory read 13k
#: distinct texts): 4,096 kept missed 80% of token-set lookups, 16,384 miss 54% (the first
#: touches) for ~11 MB more (tracemalloc; ~0.6 KB per text of ~200 characters, the words
#: shared by the stemmer's cache). Only texts up to ``_KEPT_CHARS`` long are kept, so a
#: memory of long pasted documents cannot grow the caches past ~10 KB per entry.
_TEXT_CACHE = 16_384
_KEPT_CHARS = 2_000


@functools.lru_cache(maxsize=_TEXT_CACHE)
def _token_set(text: str) -> frozenset[str]:
    return frozenset(index_tokens(text))


@functools.lru_cache(maxsize=_TEXT_CACHE)
def _term_counts(text: str) -> Counter[str]:
    return term_counts(text)


def token_set(text: str) -> frozenset[str]:
    """The index tokens of ``text`` (``text.index_tokens``) as a set."""
    return _token_set(text) if len(text) <= _KEPT_CHARS else frozenset(index_tokens(text))


def text_term_counts(text: str) -> Counter[str]:
    """``text.term_counts`` of ``text`` (shared when kept: do not change them)."""
    return _term_counts(text) if len(text) <= _KEPT_CHARS else term_counts(text)


class ExchangeReader:
    """Heads and whole exchanges of ``user_id`` read so far (``rows``: id -> head or whole)."""

    def __init__(self, store: Store, user_id: str) -> None:
        self.store = store
        self.user_id = user_id
        self.rows: dict[str, Exchange | ExchangeHead] = {}
        self._texts: dict[str, ExchangeText] = {}
        self._words: dict[str, _Words] = {}

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

    def texts(self, ids: Sequence[str]) -> dict[str, ExchangeText]:
        """The texts (and kept tokens) of ``ids`` (in that order; unknown or deleted ones left
        out): from the rows read so far, the rest in one query."""
        out = self._texts
        missing = []
        for i in ids:
            if i not in out:
                ex = self.rows.get(i)
                if isinstance(ex, Exchange):
                    out[i] = ExchangeText(ex.user_text, ex.assistant_text)
                else:
                    missing.append(i)
        if missing:
            out.update(self.store.exchange_texts(self.user_id, missing))
        return {i: t for i in ids if (t := out.get(i)) is not None}

    def keep_texts(self, texts: Mapping[str, ExchangeText]) -> None:
        """Texts read elsewhere (``exchange_texts`` rows of this user) for ``texts`` to use."""
        for i, t in texts.items():
            self._texts.setdefault(i, t)

    def by_seq(self, seqs: Sequence[int], where: ExchangeFilter | None) -> list[ExchangeHead]:
        """Heads of the exchanges at these sequence numbers (not kept: the caller decides)."""
        return self.store.heads_by_seq(self.user_id, seqs, where) if seqs else []

    def _text(self, ex_id: str) -> ExchangeText:
        got = self._texts.get(ex_id)
        return got if got is not None else self.texts([ex_id])[ex_id]

    def _kept_words(self, ex_id: str) -> _Words | None:
        """The exchange's words from its kept tokens (None: the store kept none)."""
        words = self._words.get(ex_id)
        if words is None:
            kept = self._text(ex_id).tokens
            if kept is None:
                return None
            words = self._words[ex_id] = _parse_words(kept) if len(kept) <= _KEPT_CHARS else _Words.parse(kept)
        return words

    def index_tokens(self, ex_id: str, part: int) -> frozenset[str]:
        """Index tokens of a read exchange's user (``part`` 0) or assistant (1) text."""
        words = self._kept_words(ex_id)
        if words is not None:
            return words.user if part == 0 else words.assistant
        text = self._text(ex_id)
        return token_set(text.user if part == 0 else text.assistant)

    def term_counts(self, ex_id: str) -> Counter[str]:
        """Term counts of a read exchange's text (shared: do not change them)."""
        words = self._kept_words(ex_id)
        if words is not None:
            return words.terms
        user, assistant, _ = self._text(ex_id)
        return text_term_counts(exchange_text(user, assistant))


@functools.lru_cache(maxsize=_TEXT_CACHE)
def _parse_words(record: str) -> _Words:
    # Kept for the process like the tokenised texts above: parsing the same few thousand
    # records again took about half of what reading the kept tokens saved.
    return _Words.parse(record)


class _Words:
    """An exchange's words parsed from ``text.token_record``: the index tokens of each
    message, and the term counts of the two (``text.term_counts`` of ``Exchange.text``: the
    line break joining the texts never joins two words)."""

    __slots__ = ("assistant", "terms", "user")

    def __init__(self, user: frozenset[str], assistant: frozenset[str], terms: Counter[str]) -> None:
        self.user = user
        self.assistant = assistant
        self.terms = terms

    @classmethod
    def parse(cls, record: str) -> _Words:
        user, assistant, user_terms, assistant_terms = record.split("\n")
        return cls(frozenset(user.split()), frozenset(assistant.split()),
                   Counter(user_terms.split() + assistant_terms.split()))
