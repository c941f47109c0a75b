"""Print offline titles (organize/labels.py) for groups of real texts, to read them critically.

    PYTHONPATH=src python scripts/title_samples.py [--locomo N] [--tiage N] [--subjects N]
        [--show] [--seed S]

1. LoCoMo sessions (../shared/data/locomo/*.json): one title per chunk of about six turns,
   and a theme title per session over its chunks. Document frequencies over the conversation.
2. TIAGE gold segments (../shared/data/topicseg/tiage_train.json): one title per segment.
   Document frequencies over all dialogues of the file (one "user" holding them all).
3. Subject visits (``--subjects-file``, optional; a JSON list of items with ``text`` or
   ``messages`` and a ``subject`` label): one title per consecutive run of a subject, and a
   theme title per subject over its visits.

Then checks every title printed (no digit-only word, pleasantry or stop word as a title) and
times ``phrase_counts`` and ``make_title`` per call.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from arbormem.organize.labels import (
    exchange_phrase_counts,
    make_title,
    merge_phrases,
    prune_phrases,
    theme_title,
)
from arbormem.text import STOPWORDS, terms

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
SHARED = Path("/work/shared/data") if Path("/work/shared/data").exists() else DATA
KEEP = 96  # the bound a leaf's counter would have in the tree

PLEASANTRIES = {"thanks", "thank", "great", "sounds", "sure", "welcome", "please", "awesome",
                "cool", "nice", "lol", "haha", "yeah", "wow", "hello", "hi", "hey", "okay",
                "ok", "glad", "sorry", "congrats", "amazing", "good", "fun"}


class Corpus:
    """Texts of one user: document frequencies over its documents."""

    def __init__(self, docs: Iterable[str]) -> None:
        self.df: dict[str, int] = {}
        self.n = 0
        for d in docs:
            self.n += 1
            for t in set(terms(d)):
                self.df[t] = self.df.get(t, 0) + 1


def counter(exchanges: Sequence[Sequence[str]]) -> dict[str, int]:
    """A node's bounded phrase counter over exchanges given as (user text, assistant text)."""
    out: dict[str, int] = {}
    for ex in exchanges:
        counts = exchange_phrase_counts(ex[0], ex[1] if len(ex) > 1 else "")
        out = prune_phrases(merge_phrases(out, counts), KEEP)
    return out


def locomo(limit: int, rng: random.Random, show: bool) -> list[str]:
    titles: list[str] = []
    rows: list[tuple[str, str, str]] = []
    for path in sorted((SHARED / "locomo").glob("*.json")):
        data = json.loads(path.read_text())
        conv = data["conversation"] if "conversation" in data else data
        sessions = []
        n = 1
        while f"session_{n}" in conv:
            turns = conv[f"session_{n}"]
            lines = []
            for t in turns:
                text = t["text"] + (f" [shares a photo: {t['blip_caption']}]"
                                    if t.get("blip_caption") else "")
                lines.append(f"{t['speaker']}: {text}")
            sessions.append(lines)
            n += 1
        exchanges = [s[i:i + 2] for s in sessions for i in range(0, len(s), 2)]
        corpus = Corpus("\n".join(e) for e in exchanges)
        for si, lines in enumerate(sessions, 1):
            chunks = [lines[i:i + 6] for i in range(0, len(lines), 6)]
            kids = []
            for ci, chunk in enumerate(chunks):
                exs = [chunk[i:i + 2] for i in range(0, len(chunk), 2)]
                c = counter(exs)
                kids.append(c)
                title = make_title(c, corpus.df, corpus.n, members=len(exs))
                titles.append(title)
                rows.append((f"{path.stem} s{si} c{ci}", title, " / ".join(chunk)))
            theme = theme_title(kids, corpus.df, corpus.n)
            titles.append(theme)
            rows.append((f"{path.stem} s{si} THEME", theme, ""))
    emit("LoCoMo chunks of 6 turns (and session themes)", rows, limit, rng, show)
    return titles


def tiage(limit: int, rng: random.Random, show: bool) -> list[str]:
    dialogues = json.loads((SHARED / "topicseg" / "tiage_train.json").read_text())
    corpus = Corpus(" ".join(d["utterances"][i:i + 2])
                    for d in dialogues for i in range(0, len(d["utterances"]), 2))
    titles: list[str] = []
    rows = []
    for d in dialogues:
        start = 0
        for si, size in enumerate(d["segments"]):
            utts = d["utterances"][start:start + size]
            start += size
            exs = [utts[i:i + 2] for i in range(0, len(utts), 2)]
            title = make_title(counter(exs), corpus.df, corpus.n, members=len(exs))
            titles.append(title)
            rows.append((f"d{d['dial_id']} seg{si}", title, " / ".join(utts)))
    emit("TIAGE gold segments", rows, limit, rng, show)
    return titles


def subjects(path: Path, limit: int, rng: random.Random, show: bool) -> list[str]:
    """Histories as ``[{"name", "exchanges": [{"session", "user", "assistant", "subject"}]}]``
    (a bare list of exchanges is read as one history)."""
    data = json.loads(path.read_text())
    histories = data if data and isinstance(data[0], dict) and "exchanges" in data[0] \
        else [{"name": path.stem, "exchanges": data}]
    titles: list[str] = []
    rows = []
    for h in histories:
        items = h["exchanges"]
        texts = [(str(it.get("user", "")), str(it.get("assistant", ""))) for it in items]
        corpus = Corpus("\n".join(t) for t in texts)
        visits: list[tuple[str, list[tuple[str, str]]]] = []
        for it, text in zip(items, texts, strict=True):
            s = str(it.get("subject"))
            if visits and visits[-1][0] == s:
                visits[-1][1].append(text)
            else:
                visits.append((s, [text]))
        by_subject: dict[str, list[dict[str, int]]] = {}
        for i, (s, group) in enumerate(visits):
            c = counter(group)
            by_subject.setdefault(s, []).append(c)
            title = make_title(c, corpus.df, corpus.n, members=len(group))
            titles.append(title)
            rows.append((f"visit {i} [{s}]", title, " / ".join(u for u, _ in group)))
        for s, kids in by_subject.items():
            theme = theme_title(kids, corpus.df, corpus.n)
            titles.append(theme)
            rows.append((f"THEME [{s}]", theme, ""))
    emit("Subject visits (and subject themes)", rows, limit, rng, show)
    return titles


def emit(name: str, rows: list[tuple[str, str, str]], limit: int, rng: random.Random,
         show: bool) -> None:
    print(f"\n== {name}: {len(rows)} titles, {limit} sampled ==")
    picked = sorted(rng.sample(range(len(rows)), min(limit, len(rows))))
    for i in picked:
        where, title, text = rows[i]
        print(f"{where:>22}  {title}")
        if show and text:
            print(f"{'':>24}{text[:400]}")


def check(titles: list[str]) -> None:
    bad = []
    for t in titles:
        words = re.findall(r"[^\W_]+(?:'[^\W_]+)?", t.lower())
        if any(w.isdigit() for w in words):
            bad.append((t, "number-only word"))
        elif any(w in PLEASANTRIES for w in words):
            bad.append((t, "pleasantry"))
        elif len(words) == 1 and words[0] in STOPWORDS:
            bad.append((t, "stop word"))
        elif len(t) > 40:
            bad.append((t, "too long"))
    untitled = sum(t == "Untitled" for t in titles)
    print(f"\nchecked {len(titles)} titles: {len(bad)} bad, {untitled} untitled")
    for t, why in bad[:20]:
        print(f"  BAD ({why}): {t}")


def _best_of(fn, arg, repeat: int = 5) -> float:
    """The fastest of ``repeat`` calls: what the code costs, without the scheduler's noise."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*arg)
        best = min(best, time.perf_counter() - t0)
    return best


def _pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] * 1e6


def timing(subjects_file: Path) -> None:
    dialogues = json.loads((SHARED / "topicseg" / "tiage_train.json").read_text())
    exs: list[tuple[str, str]] = []
    for path in sorted((SHARED / "locomo").glob("*.json"))[:1]:
        data = json.loads(path.read_text())
        lines = [f"{t['speaker']}: {t['text']}" for k, v in data.items()
                 if re.fullmatch(r"session_\d+", k) for t in v]
        exs += [(lines[i], lines[i + 1] if i + 1 < len(lines) else "")
                for i in range(0, len(lines), 2)]
    exs += [(d["utterances"][i], " ".join(d["utterances"][i + 1:i + 2]))
            for d in dialogues[:100] for i in range(0, len(d["utterances"]), 2)]
    if subjects_file.exists():
        exs += [(str(e.get("user", "")), str(e.get("assistant", "")))
                for h in json.loads(subjects_file.read_text()) for e in h.get("exchanges", [])]
    corpus = Corpus("\n".join(e) for e in exs)
    counts = [exchange_phrase_counts(u, a) for u, a in exs]  # warm the word-kind cache
    per_ex = [_best_of(exchange_phrase_counts, e) for e in exs]
    nodes = []
    for size in (1, 6, 30):
        for i in range(0, len(counts) - size, size):
            c: dict[str, int] = {}
            for x in counts[i:i + size]:
                c = prune_phrases(merge_phrases(c, x), KEEP)
            nodes.append((c, size))
    titles = [_best_of(lambda c, s: make_title(c, corpus.df, corpus.n, members=s), n)
              for n in nodes]
    themes = [_best_of(theme_title, ([c for c, _ in nodes[i:i + 8]], corpus.df, corpus.n))
              for i in range(0, len(nodes) - 8, 8)]
    mean_words = statistics.mean(len(" ".join(e).split()) for e in exs)
    print(f"\ntiming, fastest of 5 per call ({len(exs)} exchanges, {mean_words:.0f} words "
          "on average):")
    print(f"  exchange_phrase_counts: p50 {_pct(per_ex, .5):.0f} us, "
          f"p99 {_pct(per_ex, .99):.0f} us")
    print(f"  make_title: p50 {_pct(titles, .5):.0f} us, p99 {_pct(titles, .99):.0f} us "
          f"over {len(titles)} counters of up to {KEEP} entries")
    print(f"  theme_title over 8 children: p50 {_pct(themes, .5):.0f} us, "
          f"p99 {_pct(themes, .99):.0f} us")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--locomo", type=int, default=40)
    ap.add_argument("--tiage", type=int, default=40)
    ap.add_argument("--subjects", type=int, default=40)
    ap.add_argument("--subjects-file", type=Path, default=Path("/work/drafts/subjects_dev.json"))
    ap.add_argument("--show", action="store_true", help="print each group's text under it")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    titles = locomo(args.locomo, random.Random(args.seed), args.show)
    titles += tiage(args.tiage, random.Random(args.seed), args.show)
    if args.subjects_file.exists():
        titles += subjects(args.subjects_file, args.subjects, random.Random(args.seed),
                           args.show)
    check(titles)
    timing(args.subjects_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
