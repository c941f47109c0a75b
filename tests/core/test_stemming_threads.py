"""Stemming from several threads at once gives what one thread gives (a snowballstemmer stemmer
keeps its word on the instance: shared by threads it stemmed wrongly or raised IndexError, which
tests/robust/test_concurrency.py caught once in ~15 runs)."""

from __future__ import annotations

import threading

from arbormem import text


def test_threads_stem_as_one_thread_does() -> None:
    words = [f"{root}{suffix}" for root in ("connect", "relat", "generaliz", "hopeful", "organiz", "condition",
                                            "rational", "operat", "formaliz", "sensitiv")
             for suffix in ("ation", "ations", "ing", "ed", "er", "ness", "ively", "ization", "ional", "")]
    words = [f"{w}{'x' * k}" for k in range(40) for w in words]  # distinct: no cached stem helps
    expected = [str(text._porter().stemWord(w)) or w for w in words]
    text.stem.cache_clear()
    got: list[list[str]] = [[] for _ in range(8)]
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def work(n: int) -> None:
        start.wait()
        try:
            got[n] = [str(text._porter().stemWord(w)) or w for w in words]
        except BaseException as exc:  # the race raised IndexError mid-word
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(g == expected for g in got)
