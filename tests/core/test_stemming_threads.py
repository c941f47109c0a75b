"""Stemming from several threads at once gives what one thread gives (a snowballstemmer stemmer
keeps its word on the instance: shared by threads it stemmed wrongly or raised IndexError, which
tests/robust/test_concurrency.py caught once in ~15 runs)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from arbormem import text


def test_threads_stem_as_one_thread_does() -> None:
    words = [f"{root}{suffix}" for root in ("connect", "relat", "generaliz", "hopeful", "organiz", "condition",
                                            "rational", "operat", "formaliz", "sensitiv")
             for suffix in ("ation", "ations", "ing", "ed", "er", "ness", "ively", "ization", "ional", "")]
    words = [f"{w}{'x' * k}" for k in range(40) for w in words]  # distinct: no cached stem helps
    expected = [str(text._porter().stemWord(w)) or w for w in words]
    text.stem.cache_clear()
    start = threading.Barrier(8)

    def stem_all(_: int) -> list[str]:
        start.wait()  # all eight at once
        return [str(text._porter().stemWord(w)) or w for w in words]

    with ThreadPoolExecutor(8) as pool:  # an IndexError mid-word (the race) is raised here
        got = list(pool.map(stem_all, range(8)))
    assert all(g == expected for g in got)
