"""Token counts are exact cl100k_base counts, cut at token boundaries, and cheap to start.

The counter loads bpe_openai's compiled tokenizer without the package's import (which parses
every encoding's rank file in Python: most of a cold memory's first recall). The package's
own ``Encoding`` is the reference here.
"""

from __future__ import annotations

import subprocess
import sys

import bpe_openai
import pytest

from arbormem.tokens import TokenCounter, _encode, _pieces, _Wrapped

_ENC = bpe_openai.get_encoding("cl100k_base")

TEXTS = [
    "",
    "hello world",
    "Leo's peanut allergy: EpiPen in the red bag, 0.15 mg, since 2024-03-17.",
    "<|endoftext|> is data here, and so is <|fim_prefix|>",
    "lone \ud800 surrogates \udfff inside",
    "日本語のテキストと한국어, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and 🦕🦖 dinosaurs",
    "  \n\t\r\n  spaces\u00a0and\u2003others  ",
    "x" * 50_000,
    "word " * 30_000,
]


def _reference(text: str) -> list[int]:
    return [t for piece in _pieces(text) for t in _ENC.encode_ordinary(piece)]


@pytest.mark.parametrize("text", TEXTS)
def test_counts_equal_the_package_encoding(text: str) -> None:
    assert _encode("cl100k_base", text) == _reference(text)
    assert TokenCounter().count(text) == len(_reference(text))


@pytest.mark.parametrize("text", TEXTS[1:])
def test_truncate_cuts_the_longest_whole_character_prefix(text: str) -> None:
    counter = TokenCounter()
    ids = _reference(text)
    for budget in sorted({1, 2, 3, 5, 8, len(ids) // 2, len(ids) - 1, len(ids)}):
        if budget <= 0:
            continue
        cut = counter.truncate(text, budget)
        clean = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        assert clean.startswith(cut) or text.startswith(cut)
        assert counter.count(cut) <= budget
        if budget >= len(ids):
            assert cut == text
        else:
            assert cut == _longest_whole_prefix(ids, budget)


def _longest_whole_prefix(ids: list[int], budget: int) -> str:
    """The reference cut: the most tokens, at most ``budget``, whose bytes decode whole."""
    for end in range(budget, 0, -1):
        try:
            return _ENC.decode_bytes(ids[:end]).decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""


def test_truncate_steps_back_out_of_a_split_character() -> None:
    text = "🦕🦖"
    ids = _reference(text)
    assert len(ids) > 2  # each emoji is several byte tokens
    counter = TokenCounter()
    assert counter.truncate(text, 1) == ""
    assert counter.truncate(text, len(ids) - 1) == "🦕"


def test_the_fallback_encoding_agrees() -> None:
    wrapped = _Wrapped("cl100k_base")
    for text in TEXTS:
        clean = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        assert wrapped.encode(clean) == _ENC.encode_ordinary(clean)
    ids = _ENC.encode_ordinary("🦕")
    with pytest.raises(ValueError):
        wrapped.decode(ids[:1])


def test_first_count_skips_the_package_import_and_the_package_still_works_after() -> None:
    code = (
        "import sys, time\n"
        "from arbormem.tokens import TokenCounter\n"
        "t = time.perf_counter(); n = TokenCounter().count('hello world'); took = time.perf_counter() - t\n"
        "assert 'bpe_openai' not in sys.modules, 'the package was imported'\n"
        "import bpe_openai\n"
        "assert len(bpe_openai.get_encoding('cl100k_base').encode_ordinary('hello world')) == n == 2\n"
        "print(took)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert float(out.stdout.strip()) < 2.0  # ~0.03 s; the package's import took 0.8-6 s
