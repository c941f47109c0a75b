"""Offline judgements of exchange text used by consolidation: is an exchange content-free
("ok" / "glad to help!"), does a message correct an earlier fact ("actually, ..."), which
names does a text mention, are two texts the same words (near-duplicates). English cue and
pleasantry lists; other languages fall back to the length and term checks.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from ..models import Exchange
from ..text import STOPWORDS, terms

# Words that carry no content in a reply to "ok"/"thanks" (on top of text.STOPWORDS, which
# already holds ok, thanks, yes, hi ...). English; in other languages short replies are still
# caught by the length limit only when they have no content terms after IDF... so they are kept.
_PHATIC = frozenset(
    """great good nice cool awesome perfect fine sure alright right welcome glad happy help
    helps helped anything else need let bye goodbye cheers see later soon np problem sounds
    noted gotcha understood wonderful excellent appreciate appreciated pleasure anytime
    course absolutely definitely indeed agreed kind ask feel free hope day night morning""".split()
)
_TRIVIAL_WORDS = 20  # TRACE: both sides under 20 words


def is_trivial(ex: Exchange) -> bool:
    """A short exchange with no content terms on either side ("ok" / "Glad to help!")."""
    for side in (ex.user_text, ex.assistant_text):
        if len(side.split()) >= _TRIVIAL_WORDS:
            return False
        if any(t not in _PHATIC for t in terms(side)):
            return False
    return bool(ex.user_text.strip())


# Words a pleasantry adds to _PHATIC's: "Thank you, you've been so helpful", "Phew. Thanks for
# all your help", "Perfect, that's everything".
_PLEASANTRY = _PHATIC | frozenset("everything phew helpful lovely brilliant fantastic ta amazing super".split())


def is_pleasantry(user_text: str) -> bool:
    """A message that says nothing but pleasantries (thanks, assent, goodbye; numbers such as
    a confirmed time aside) and asks nothing: "Thank you, you've been so helpful.", "ok
    great", "Fine, see you at 11:20." It names no subject, so it never opens one
    (``TreeSession.place``; docs/tree.md, "Pleasantries")."""
    if "?" in user_text:
        return False
    return all(t in _PLEASANTRY or t.isdigit() for t in terms(user_text))


# Only cues that mark a correction. "now", "update", "instead", "has changed" and a bare
# "any more" are far too common alone: on LoCoMo dialogue they only produced false updates
# ("Any more paintings coming up?", "A lot has changed since last time").
_CUE = re.compile(
    r"(?:^|[.!?,;:]\s*)actually\b|\bno longer\b|(?:\bnot|n't|\bno)\b[^.!?]{0,40}\bany ?more\b|"
    r"\bchanged my mind\b|\bchange of plans?\b|\bcorrection\b|\bturns out\b|\bfrom now on\b",
    re.IGNORECASE,
)
_NAME = re.compile(r"\b([A-Z][^\W_]+)(?:['’]s)?\b")


def update_cue(text: str) -> bool:
    """Whether a message reads like a correction of an earlier fact (English cue words)."""
    return _CUE.search(text) is not None


def names(text: str) -> set[str]:
    """Capitalised words that are not function or cue words: a cheap entity guess (works for
    any script with case; caseless scripts simply give no names and rely on shared terms)."""
    out = set()
    for m in _NAME.finditer(text):
        w = m.group(1).lower()
        if w not in STOPWORDS and w not in _PHATIC and not _CUE.fullmatch(w) and len(w) > 1:
            out.add(w)
    return out


def _words(text: str) -> set[str]:
    return set(re.findall(r"[^\W_]+", text.casefold()))


def near_duplicate_text(a: str, b: str) -> bool:
    """Same words up to case, punctuation and a few edits (Jaccard >= 0.9 over word sets)."""
    wa, wb = _words(a), _words(b)
    if not wa or not wb:
        return a.strip() == b.strip()
    return len(wa & wb) / len(wa | wb) >= 0.9



def signature(text: str) -> str:
    """The exchange's words, case-folded, in order: equal for the same content re-sent with
    other case, spacing or punctuation."""
    return " ".join(re.findall(r"[^\W_]+", text.casefold()))


def shared_words(a: Mapping[str, int], b: Mapping[str, int], df: Mapping[str, int], n_docs: int) -> float:
    """How much two branches of a tree name the same things, in [0, 1]: the cosine of their
    term counts (``TopicRecord.terms``) weighted by (1 + log count) x log(n_docs / df), over
    the words that recur (df >= 2) but are not everywhere (df <= n_docs / 4).

    Why: two visits to one subject months apart (weeding the allotment's beds in March,
    planting onion sets in May) can be far apart by average vector link, while both say
    "allotment", "bed", "plot"; a word in a quarter of a user's exchanges (a name, "plan") says nothing of a
    subject, and a word seen once cannot be shared. Only consolidation uses it
    (``TreeSession.join_related``), on the bounded top level."""
    def weights(counts: Mapping[str, int]) -> dict[str, float]:
        out = {}
        for w, c in counts.items():
            d = df.get(w, 0)
            if c > 0 and 2 <= d <= n_docs / 4:
                out[w] = (1.0 + math.log(c)) * math.log(n_docs / d)
        return out

    wa, wb = weights(a), weights(b)
    if not wa or not wb:
        return 0.0
    num = sum(v * wb[w] for w, v in wa.items() if w in wb)
    return num / math.sqrt(sum(v * v for v in wa.values()) * sum(v * v for v in wb.values()))


__all__ = ["is_pleasantry", "is_trivial", "names", "near_duplicate_text", "shared_words", "signature", "update_cue"]
