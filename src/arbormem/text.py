"""Language-neutral text helpers shared by the organiser and the retriever.

Terms are Unicode word tokens, lower-cased, with a short stop-word list; everything else about
term importance comes from per-user document frequencies (IDF), which works in any language
whose words are separated by spaces or punctuation.
"""

from __future__ import annotations

import functools
import heapq
import math
import re
import threading
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)?", re.UNICODE)
_SENT = re.compile(r"(?<=[.!?。！？])\s+")

# English function words; other languages are handled by IDF (frequent words weigh little).
STOPWORDS = frozenset(
    """a about above after again against all also am an and any are aren't as at be because been
    before being below between both but by can can't cannot could couldn't did didn't do does
    doesn't doing don't down during each few for from further had hadn't has hasn't have haven't
    having he he'd he'll he's her here here's hers herself him himself his how how's i i'd i'll i'm
    i've if in into is isn't it it's its itself just let's me more most mustn't my myself no nor
    not now of off on once only or other ought our ours ourselves out over own same shan't she
    she'd she'll she's should shouldn't so some such than that that's the their theirs them
    themselves then there there's these they they'd they'll they're they've this those through to
    too under until up very was wasn't we we'd we'll we're we've were weren't what what's when
    when's where where's which while who who's whom why why's with won't would wouldn't you you'd
    you'll you're you've your yours yourself yourselves yes yeah ok okay oh hey hi hello thanks
    thank really lot get got go going gonna wanna will like know think well much many one also
    s t re ve ll d m""".split()
)


def terms(text: str) -> list[str]:
    """Content terms of ``text`` in order (lower-case words, stop words dropped)."""
    return [t for w in _WORD.findall(text.lower()) if (t := _term(w))]


@functools.lru_cache(maxsize=100_000)
def _term(w: str) -> str:
    """The term a lower-cased word stands for, or "" (a stop word or a single letter). Cached:
    recall reads the same words in dozens of exchanges per query (word frequencies are Zipfian),
    and the per-word checks were most of what reading them cost."""
    w = w.replace("’", "'")
    if w.endswith("'s"):
        w = w[:-2]
    if (len(w) < 2 and not w.isdigit()) or w in STOPWORDS:
        return ""
    return w


def identifier_like(term: str) -> bool:
    """An order number, a tracking number, a code: letters and digits mixed (four characters
    or more: "ord3fa91c0b2e", "A113X", "covid19") or a number of four digits or more that is
    not a year 1900-2099 ("7431", "481516234200"; small counts and years are ordinary words)."""
    digits = sum(c.isdigit() for c in term)
    if not digits:
        return False
    if digits < len(term):
        return len(term) >= 4
    return len(term) >= 5 or (len(term) == 4 and term[:2] not in ("19", "20"))


#: A word that is only a number ("19", "2.04", "17th", "000", "5k", "1990s"): never a title word.
_NUMBER_WORD = re.compile(r"^[\d.,:/%£$€-]+(st|nd|rd|th|k|s)?$", re.IGNORECASE)


def number_only(word: str) -> bool:
    return bool(_NUMBER_WORD.match(word))


def term_counts(text: str) -> Counter[str]:
    return Counter(terms(text))


def idf(df: int, n_docs: int) -> float:
    """Smoothed inverse document frequency (BM25's, floored at a small positive value)."""
    return max(0.05, math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5)))


def top_terms(
    counts: Mapping[str, int], df: Mapping[str, int], n_docs: int, k: int,
    idfs: dict[str, float] | None = None,
) -> list[str]:
    """The ``k`` terms of ``counts`` with the highest tf·idf (ties broken alphabetically).

    ``idfs`` keeps each term's idf across calls with the same ``df`` and ``n_docs``: a tree
    flush ranks the counters of a hundred nodes sharing most of their terms, and computing the
    idf per term per node was most of the ranking."""
    memo = {} if idfs is None else idfs
    scored = []
    for t, c in counts.items():
        w = memo.get(t)
        if w is None:
            w = memo[t] = idf(df.get(t, 1), n_docs)
        scored.append((-(1.0 + math.log(c)) * w, t))
    return [t for _, t in heapq.nsmallest(k, scored)]


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENT.split(text) if s.strip()]


def shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut + "…"


def prune_counts(counts: Mapping[str, int], keep: int) -> dict[str, int]:
    """Keep the ``keep`` most frequent terms (bounded per-node term statistics)."""
    if len(counts) <= keep:
        return dict(counts)
    # By count, descending, then by term: two C-level sorts (terms are unique; the second,
    # stable sort keeps them in order within a count) cost half the one with a tuple key,
    # and ingest prunes every ancestor's counter for every exchange. The terms alone are
    # sorted, not (term, count) pairs: a third faster again, the same order.
    ranked = sorted(counts)
    ranked.sort(key=counts.__getitem__, reverse=True)
    return {t: counts[t] for t in ranked[:keep]}


def merge_counts(a: Mapping[str, int], b: Iterable[tuple[str, int]]) -> dict[str, int]:
    out = dict(a)
    for t, c in b:
        out[t] = out.get(t, 0) + c
    return out


# -- stemmed index tokens (lexical indexes and the retriever's term matching) --------------------
_INDEX_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_MAX_LEXEME = 200


_LOCAL = threading.local()


def _porter() -> Any:
    """This thread's Porter stemmer. A snowballstemmer stemmer keeps its word and cursor on the
    instance, so one shared by threads (a recall's lexical worker beside another thread's
    write) stemmed wrongly or raised IndexError mid-word (tests/robust/test_concurrency.py
    caught it, 1 run in ~15)."""
    porter = getattr(_LOCAL, "porter", None)
    if porter is None:
        import snowballstemmer  # imported on first use: no work at import time

        porter = _LOCAL.porter = snowballstemmer.stemmer("porter")
    return porter


@functools.lru_cache(maxsize=100_000)
def stem(word: str) -> str:
    """Porter stem of one lower-case word, as SQLite FTS5's ``porter`` tokenizer makes it.

    Only ASCII words are stemmed, like FTS5 (the rules are English; other scripts pass
    through); words of one or two letters stay as they are ("s" would stem to nothing). The
    cache makes repeated words (most of them: word frequencies are Zipfian) a dict lookup.
    """
    if len(word) < 3 or not (word.isascii() and word.isalpha()):
        return word
    return str(_porter().stemWord(word)) or word


def index_tokens(text: str) -> list[str]:
    """Index tokens: Unicode letter/digit runs, lower-cased, diacritics removed, English words
    Porter-stemmed. The PostgreSQL store indexes these; SQLite's FTS5 tokenizer
    (``porter unicode61``) makes the same."""
    folded = text.lower()
    if not folded.isascii():  # (ASCII text has nothing to decompose: skip the per-character pass)
        folded = unicodedata.normalize("NFKD", folded)
        folded = "".join(ch for ch in folded if not unicodedata.combining(ch))
    return [stem(w) for w in _INDEX_WORD.findall(folded) if len(w) <= _MAX_LEXEME]


def token_record(user_text: str, assistant_text: str) -> str:
    """An exchange's words as recall's coverage and feedback steps read them, computed once
    when the exchange is written (stores keep it beside the text): the index tokens of the
    user and of the assistant message, then the content terms of each, four lines of
    space-separated words (no token holds a space or a line break). Tokenising the few dozen
    exchanges each recall reads was ~1 ms of its own work at 10k exchanges (BENCHMARKS.md,
    "Tokens kept at write")."""
    return "\n".join((" ".join(index_tokens(user_text)), " ".join(index_tokens(assistant_text)),
                      " ".join(terms(user_text)), " ".join(terms(assistant_text))))
