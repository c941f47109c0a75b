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
    phrase_counts,
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


def timing() -> None:
    dialogues = json.loads((SHARED / "topicseg" / "tiage_train.json").read_text())
    data = json.loads(sorted((SHARED / "locomo").glob("*.json"))[0].read_text())
    texts = [f"{t['speaker']}: {t['text']}" for k, v in data.items()
             if re.fullmatch(r"session_\d+", k) for t in v]
    exs = ["\n".join(texts[i:i + 2]) for i in range(0, len(texts), 2)]
    exs += [" ".join(d["utterances"][i:i + 2]) for d in dialogues[:100]
            for i in range(0, len(d["utterances"]), 2)]
    corpus = Corpus(exs)

    t0 = time.perf_counter()
    counts = [phrase_counts(e) for e in exs]
    per_text = (time.perf_counter() - t0) / len(exs)
    nodes = []
    for size in (1, 6, 30):
        for i in range(0, len(counts) - size, size):
            c: dict[str, int] = {}
            for x in counts[i:i + size]:
                c = prune_phrases(merge_phrases(c, x), KEEP)
            nodes.append((c, size))
    samples = []
    for c, size in nodes:
        t0 = time.perf_counter()
        make_title(c, corpus.df, corpus.n, members=size)
        samples.append(time.perf_counter() - t0)
    kids = [c for c, _ in nodes[:8]]
    t0 = time.perf_counter()
    for _ in range(200):
        theme_title(kids, corpus.df, corpus.n)
    per_theme = (time.perf_counter() - t0) / 200
    mean_words = statistics.mean(len(e.split()) for e in exs)
    print(f"\ntiming ({len(exs)} texts, {mean_words:.0f} words on average):")
    print(f"  phrase_counts: {per_text * 1e6:.0f} us per text")
    print(f"  make_title: p50 {statistics.median(samples) * 1e6:.0f} us, "
          f"max {max(samples) * 1e6:.0f} us over {len(samples)} counters "
          f"of up to {KEEP} entries")
    print(f"  theme_title over 8 children: {per_theme * 1e6:.0f} us")


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
    timing()
    return 0


if __name__ == "__main__":
    sys.exit(main())
