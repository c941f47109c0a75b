"""``arbormem eval topics`` and ``arbormem eval subjects``: is the tree organised?

* **topics** scores leaves against human topic segments (the standard segmentation format: a
  JSON list of ``{"utterances": [...], "segments": [lengths]}``). Each dialogue goes into a
  fresh user of one memory, consecutive utterances paired into exchanges (first speaker as
  user); every utterance is labelled with its exchange's leaf. Baselines over the same
  exchange vectors, in the same run: TextTiling, one segment, every exchange a segment, and
  random boundaries (the gold count).
* **subjects** scores the top of the tree on histories of several subjects over interleaved
  sessions (a JSON list of ``{"name", "exchanges": [{"session", "at", "user", "assistant",
  "subject"}]}``): V-measure of top-level branches against subjects, themes that mix
  subjects, the share of consecutive exchanges within one visit to a subject that share a
  topic, number-only title words, topics titled as their theme, the V-measure and mixed
  branches again after a consolidation run, and how many top-level titles name their
  subject (``names_subject``), and V and mixed branches once more with every one-off question
  ("misc:" labels) as one subject, "odds and ends"; and prints the tree as placed and after
  consolidation.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ValidationError
from ..memory import Memory
from ..models import Topic
from ..organize.labels import title_key
from ..text import number_only
from . import segmetrics as sm


def _load(path: str) -> list[dict[str, Any]]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValidationError(f"{path}: cannot read JSON ({exc})") from exc
    if not isinstance(data, list):
        raise ValidationError(f"{path}: expected a JSON list")
    return data


# -- segmentation against gold segments ------------------------------------------------------------
@dataclass
class SegScores:
    name: str
    pk: list[float] = field(default_factory=list)
    wd: list[float] = field(default_factory=list)
    tp: int = 0
    pred: int = 0
    gold: int = 0
    hom: list[float] = field(default_factory=list)
    com: list[float] = field(default_factory=list)
    v: list[float] = field(default_factory=list)
    leaves: list[int] = field(default_factory=list)
    single: list[float] = field(default_factory=list)

    def add(self, gold: Sequence[int], exchange_labels: Sequence[object], n_utt: int) -> None:
        pred = [exchange_labels[i // 2] for i in range(n_utt)]
        self.pk.append(sm.pk(gold, pred))
        self.wd.append(sm.window_diff(gold, pred))
        tp, p, g = sm.boundary_prf(gold, pred)
        self.tp, self.pred, self.gold = self.tp + tp, self.pred + p, self.gold + g
        h, c, v = sm.v_measure(gold, pred)
        self.hom.append(h)
        self.com.append(c)
        self.v.append(v)
        sizes = Counter(exchange_labels)
        self.leaves.append(len(sizes))
        self.single.append(sum(1 for n in sizes.values() if n == 1) / len(sizes))

    def row(self) -> dict[str, Any]:
        prec = self.tp / self.pred if self.pred else 0.0
        rec = self.tp / self.gold if self.gold else 0.0
        f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
        return {"system": self.name, "pk": float(np.mean(self.pk)), "windowdiff": float(np.mean(self.wd)),
                "boundary_f1": f1, "homogeneity": float(np.mean(self.hom)),
                "completeness": float(np.mean(self.com)), "v_measure": float(np.mean(self.v)),
                "leaves_per_dialogue": float(np.mean(self.leaves)),
                "single_exchange_leaves": float(np.mean(self.single))}


def exchange_pairs(utterances: Sequence[object]) -> list[tuple[str, str]]:
    """Consecutive utterances as the (user, assistant) exchanges ``eval_segmentation`` stores:
    an empty utterance reads ".", an odd last one has no reply ("")."""
    u = [str(x) or "." for x in utterances]
    return [(u[j], u[j + 1] if j + 1 < len(u) else "") for j in range(0, len(u), 2)]


def eval_segmentation(files: Sequence[str], mem: Memory, *, seed: int = 0) -> dict[str, Any]:
    """Run every dialogue of ``files`` through ``mem`` and score leaves and baselines."""
    rng = random.Random(seed)
    systems = {n: SegScores(n) for n in ("arbormem", "texttiling", "random", "one segment", "every exchange")}
    dialogues = gold_segments = 0
    t0 = time.perf_counter()
    for path in files:
        for d_i, d in enumerate(_load(path)):
            utts, segs = d.get("utterances"), d.get("segments")
            if not isinstance(utts, list) or not isinstance(segs, list) or sum(segs) != len(utts) or not utts:
                raise ValidationError(f"{path} item {d_i}: needs utterances and segments summing to their count")
            uid = f"eval-topics-{Path(path).stem}-{d_i}"
            items = [{"messages": [{"role": "user", "content": q}] + ([{"role": "assistant", "content": a}] if a else []),
                      "session_id": "dialogue"} for q, a in exchange_pairs(utts)]
            added = mem.add_many(items, user_id=uid)
            topic_of = {e.id: e.topic_id for e in mem.exchanges(user_id=uid)}
            labels = [topic_of[e.id] for e in added]
            vecs = mem.store.get_vectors(uid, "exchange", [e.id for e in added])
            mat = np.stack([vecs[e.id] for e in added])
            gold = sm.labels_from_segments(segs)
            n = len(utts)
            systems["arbormem"].add(gold, labels, n)
            systems["texttiling"].add(gold, sm.texttiling(mat), n)
            systems["random"].add(gold, sm.random_labels(len(added), len(segs), rng), n)
            systems["one segment"].add(gold, [0] * len(added), n)
            systems["every exchange"].add(gold, list(range(len(added))), n)
            dialogues += 1
            gold_segments += len(segs)
            mem.delete_user(uid)
    return {"files": list(files), "dialogues": dialogues,
            "gold_segments_per_dialogue": gold_segments / max(1, dialogues),
            "seconds": time.perf_counter() - t0,
            "rows": [s.row() for s in systems.values()]}


def format_segmentation(rep: dict[str, Any]) -> str:
    lines = [f"{rep['dialogues']} dialogues, {rep['gold_segments_per_dialogue']:.2f} gold segments each "
             f"({', '.join(Path(f).name for f in rep['files'])})", "",
             "| system | Pk | WindowDiff | boundary F1 | homogeneity | completeness | V | leaves/dialogue | single-exchange leaves |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rep["rows"]:
        lines.append(f"| {r['system']} | {r['pk']:.3f} | {r['windowdiff']:.3f} | {r['boundary_f1']:.3f} | "
                     f"{r['homogeneity']:.3f} | {r['completeness']:.3f} | {r['v_measure']:.3f} | "
                     f"{r['leaves_per_dialogue']:.2f} | {r['single_exchange_leaves']:.2f} |")
    return "\n".join(lines)


# -- subject grouping ----------------------------------------------------------------------------
def number_only_words(title: str) -> list[str]:
    return [w for w in re.split(r"[\s·›]+", title) if w and number_only(w)]


def eval_subjects(files: Sequence[str], mem: Memory) -> dict[str, Any]:
    histories = []
    for path in files:
        for h_i, h in enumerate(_load(path)):
            rows = h.get("exchanges") or []
            uid = f"eval-subjects-{Path(path).stem}-{h_i}"
            items = [{"messages": [{"role": "user", "content": x["user"]},
                                   {"role": "assistant", "content": x["assistant"]}],
                      "session_id": x.get("session"), "at": x.get("at")} for x in rows]
            added = mem.add_many(items, user_id=uid)
            topic_of = {e.id: e.topic_id for e in mem.exchanges(user_id=uid)}
            root = mem.tree(user_id=uid)
            subjects = [str(x["subject"]) for x in rows]
            leaves = [topic_of[e.id] or "" for e in added]
            hom, com, v, mixed = _grouping(root, subjects, leaves)
            # The same after a consolidation run (docs/tree.md, "Short returns"): what a user
            # sees once the organiser has tidied the tree.
            mem.consolidate(uid)
            topic_of = {e.id: e.topic_id for e in mem.exchanges(user_id=uid)}
            after = mem.tree(user_id=uid)
            leaves_after = [topic_of[e.id] or "" for e in added]
            _, _, v_after, mixed_after = _grouping(after, subjects, leaves_after)
            # The same with every one-off question as one subject, "odds and ends" (issue 17's
            # own example history lists it as one of its eight subjects): a one-off filed under
            # a subject then mixes that branch, and one-offs left apart split their subject.
            odds = [ONE_OFFS if s.startswith("misc") else s for s in subjects]
            _, _, v_odds, mixed_odds = _grouping(after, odds, leaves_after)
            named, titled = _titles_naming(after, subjects, leaves_after, h.get("subject_titles") or {})
            same = total = 0
            for i in range(1, len(rows)):
                a, b = rows[i - 1], rows[i]
                if a.get("session") == b.get("session") and a["subject"] == b["subject"]:
                    total += 1
                    same += leaves[i - 1] == leaves[i]
            nodes = root.walk()
            titles = [n.title for n in nodes if n.kind != "root"]
            histories.append({
                "name": h.get("name", f"history {h_i}"), "exchanges": len(rows),
                "subjects": len(set(subjects)), "top_level": len(root.children),
                "topics": sum(1 for n in nodes if n.kind == "topic"),
                "themes": sum(1 for n in nodes if n.kind == "theme"),
                "v_measure": v, "homogeneity": hom, "completeness": com,
                "leaf_v_measure": sm.v_measure(subjects, leaves)[2],
                "mixed_top_level": mixed, "visit_share": same / total if total else 1.0,
                "consolidated": {"v_measure": v_after, "mixed_top_level": mixed_after,
                                 "titles_naming_subject": named, "titles_judged": titled,
                                 "v_measure_odds": v_odds, "mixed_top_level_odds": mixed_odds,
                                 "top_level": len(after.children),
                                 "tree": render_tree(after, _composition(subjects, leaves_after))},
                "number_only_titles": sum(1 for t in titles if number_only_words(t)),
                "repeated_titles": sum(1 for n in nodes for c in n.children
                                       if n.kind == "theme" and title_key(c.title) == title_key(n.title)),
                "tree": render_tree(root, _composition(subjects, leaves)),
            })
            mem.delete_user(uid)
    return {"files": list(files), "histories": histories}


def _composition(subjects: list[str], leaves: list[str]) -> dict[str, Counter[str]]:
    """Each leaf's gold subjects, counted."""
    return {t: Counter(s for s, lf in zip(subjects, leaves, strict=True) if lf == t) for t in set(leaves)}


#: The one subject all one-off questions ("misc:..." labels) count as in the "odds and ends"
#: columns of ``eval_subjects``.
ONE_OFFS = "odds-and-ends"


def _grouping(root: Topic, subjects: list[str], leaves: list[str]) -> tuple[float, float, float, int]:
    """Homogeneity, completeness and V-measure of the top-level branches against the
    subjects, and how many branches mix subjects (the "misc:" one-offs aside; ``ONE_OFFS``
    is a subject like any other)."""
    top_of = _top_level_of(root)
    tops = [top_of.get(t, t) for t in leaves]
    hom, com, v = sm.v_measure(subjects, tops)
    mixed = [b for b in set(tops) if len({s for s, t in zip(subjects, tops, strict=True) if t == b
                                         and not s.startswith("misc")}) > 1]
    return hom, com, v, len(mixed)


_STEM_SUFFIXES = ("ing", "es", "s")
_LABEL_STOP = frozenset("misc vs and or the of to for a an in on at my her his their our".split())


def _title_words(text: str) -> set[str]:
    """Content words of a title or a subject label, crudely stemmed ("kayaking" and "kayak",
    "Mum's" and "mum" meet); function words and "misc" out."""
    out = set()
    for w in re.split(r"[^\w']+", text.lower().replace("\u2019", "'")):
        w = w.removesuffix("'s").strip("'")
        for suf in _STEM_SUFFIXES:
            if len(w) > 4 and w.endswith(suf):
                w = w[: -len(suf)]
                break
        if w and w not in _LABEL_STOP:
            out.add(w)
    return out



def names_subject(title: str, subject: str) -> bool:
    """Whether a title names a subject: a shared content word, the first five letters
    enough ("Sea kayaking" names "sea-kayaking", "Hip replacement" names
    "des-hip-replacement", "Surgeon" does not). ``subject`` is the history's label of it, or
    the title its writer gave it (``subject_titles``)."""
    a, b = _title_words(title), _title_words(subject.replace("-", " ").replace(":", " "))
    return any(x == y or (min(len(x), len(y)) >= 4 and x[:5] == y[:5]) for x in a for y in b)


def _titles_naming(root: Topic, subjects: list[str], leaves: list[str],
                   written: dict[str, str]) -> tuple[int, int]:
    """Of the top-level branches of more than one exchange, how many are titled after the
    subject most of their exchanges are about (its writer's title when the history gives
    ``subject_titles``, else its label), and how many were judged."""
    top_of = _top_level_of(root)
    held: dict[str, Counter[str]] = {}
    for s, t in zip(subjects, leaves, strict=True):
        held.setdefault(top_of.get(t, t), Counter())[s] += 1
    named = judged = 0
    for branch in root.children:
        counts = held.get(branch.id)
        if counts is None or branch.size < 2:
            continue
        subject = counts.most_common(1)[0][0]
        judged += 1
        named += names_subject(branch.title, written.get(subject) or subject)
    return named, judged


def _top_level_of(root: Topic) -> dict[str, str]:
    """Node id -> id of its top-level branch (a child of the root)."""
    out: dict[str, str] = {}
    for branch in root.children:
        for node in branch.walk():
            out[node.id] = branch.id
    return out


def render_tree(root: Topic, subjects_of: dict[str, Counter[str]] | None = None) -> str:
    """The tree as indented text, leaves with their sizes (and gold subjects when known)."""
    out: list[str] = []

    def walk(node: Topic, depth: int) -> None:
        label = f"{'  ' * depth}{node.title or '(root)'} [{node.size}]"
        if subjects_of is not None and node.kind == "topic":
            label += "  " + ", ".join(f"{s}:{n}" for s, n in subjects_of.get(node.id, Counter()).most_common())
        out.append(label)
        for c in node.children:
            walk(c, depth + 1)

    walk(root, 0)
    return "\n".join(out)


def format_subjects(rep: dict[str, Any], *, trees: bool = True) -> str:
    lines = ["| history | exchanges | subjects | top-level branches | topics | themes | top-level V | "
             "homogeneity | completeness | mixed branches | visit share | number-only titles | "
             "titles repeating their theme's | after consolidation: top-level V | mixed | "
             "top-level titles naming their subject | one-offs as one subject: V | mixed |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for h in rep["histories"]:
        lines.append(f"| {h['name']} | {h['exchanges']} | {h['subjects']} | {h['top_level']} | {h['topics']} | "
                     f"{h['themes']} | {h['v_measure']:.3f} | {h['homogeneity']:.3f} | {h['completeness']:.3f} | "
                     f"{h['mixed_top_level']} | {h['visit_share']:.2f} | {h['number_only_titles']} | "
                     f"{h['repeated_titles']} | {h['consolidated']['v_measure']:.3f} | "
                     f"{h['consolidated']['mixed_top_level']} | "
                     f"{h['consolidated']['titles_naming_subject']} / {h['consolidated']['titles_judged']} | "
                     f"{h['consolidated']['v_measure_odds']:.3f} | {h['consolidated']['mixed_top_level_odds']} |")
    hs = rep["histories"]
    if hs:
        lines.append(f"| mean | | | | | | {np.mean([h['v_measure'] for h in hs]):.3f} | "
                     f"{np.mean([h['homogeneity'] for h in hs]):.3f} | {np.mean([h['completeness'] for h in hs]):.3f} | "
                     f"{sum(h['mixed_top_level'] for h in hs)} | {np.mean([h['visit_share'] for h in hs]):.2f} | "
                     f"{sum(h['number_only_titles'] for h in hs)} | {sum(h['repeated_titles'] for h in hs)} | "
                     f"{np.mean([h['consolidated']['v_measure'] for h in hs]):.3f} | "
                     f"{sum(h['consolidated']['mixed_top_level'] for h in hs)} | "
                     f"{sum(h['consolidated']['titles_naming_subject'] for h in hs)} / "
                     f"{sum(h['consolidated']['titles_judged'] for h in hs)} | "
                     f"{np.mean([h['consolidated']['v_measure_odds'] for h in hs]):.3f} | "
                     f"{sum(h['consolidated']['mixed_top_level_odds'] for h in hs)} |")
    if trees:
        for h in hs:
            lines += ["", f"{h['name']}, as placed:", h["tree"],
                      "", f"{h['name']}, after one consolidation run:", h["consolidated"]["tree"]]
    return "\n".join(lines)
