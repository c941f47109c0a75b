"""Train the topic-shift head of the bundled embedder (``organize/shift.py``) and write it to
``src/arbormem/data/shift_minilm.json``::

    python scripts/train_shift_head.py ../shared/data/topicseg/tiage_train.json

Development data only, one equal share per corpus (so chit-chat, with many more examples, does
not set the head alone):

* TIAGE's training dialogues (the file given);
* the even-numbered dialogues of ``benchmarks/data/taskseg_dev.json`` (the odd ones are held out)
  and the three task sets other hands wrote, read blind once each and development data since
  (``taskseg_check.json``, ``taskseg_check2.json``, ``taskseg_check3.json``: MultiWOZ and in-car
  styles, ten domains; added 2026-12-04, docs/tree.md "More task styles");
* the first two histories of ``benchmarks/data/subjects_dev.json`` (a boundary wherever the
  subject changes within a session; the last two are held out).

Utterances pair into exchanges as ``arbormem eval topics`` pairs them (``exchange_pairs``); an exchange is a
boundary when its user message's gold segment differs from the previous exchange's. Prints the
held-out figures of the head alone (a boundary where its probability passes the threshold).
Needs scikit-learn (installed with sentence-transformers).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "src/arbormem/data/shift_minilm.json"
C = 0.3  # L2 strength (0.1-1.0 held-out within +-0.01 Pk)
THRESHOLD = 0.60  # TreeSettings.shift_threshold, for the printed held-out figures
#: Task dialogues in the task share besides taskseg_dev's even half.
TASK_SETS = ("taskseg_check.json", "taskseg_check2.json", "taskseg_check3.json")


def _segmented(dialogues: list[dict]) -> list[tuple[list[str], list[str], list[int]]]:
    """(user texts, assistant texts, boundary before each exchange) per dialogue."""
    from arbormem.eval.topics import exchange_pairs

    out = []
    for d in dialogues:
        pairs = exchange_pairs(d["utterances"])
        users, replies = [q for q, _ in pairs], [a for _, a in pairs]
        gold = [s for s, n in enumerate(d["segments"]) for _ in range(n)]
        out.append((users, replies, [0] + [int(gold[2 * i] != gold[2 * i - 2]) for i in range(1, len(users))]))
    return out


def _sessions(histories: list[dict]) -> list[tuple[list[str], list[str], list[int]]]:
    out = []
    for h in histories:
        runs: list[list[dict]] = []
        for e in h["exchanges"]:
            if not runs or runs[-1][-1]["session"] != e["session"]:
                runs.append([])
            runs[-1].append(e)
        for run in runs:
            out.append(([e["user"] for e in run], [e["assistant"] for e in run],
                        [0] + [int(run[i]["subject"] != run[i - 1]["subject"]) for i in range(1, len(run))]))
    return out


def _matrix(emb, dialogues):  # type: ignore[no-untyped-def]
    from arbormem.models import exchange_text
    from arbormem.organize.shift import features

    texts = [exchange_text(u, a) for users, replies, _ in dialogues for u, a in zip(users, replies, strict=True)]
    vecs = emb.embed(texts)
    xs, ys, k = [], [], 0
    for users, replies, bounds in dialogues:
        v = vecs[k : k + len(users)]
        k += len(users)
        for i in range(1, len(users)):
            xs.append(features(v[i], v[i - 1], v[i - 2] if i >= 2 else None, users[i], replies[i - 1]))
            ys.append(bounds[i])
    return np.array(xs), np.array(ys)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tiage_train")
    ap.add_argument("--dev", help="TIAGE dev file, for the printed held-out figures")
    ap.add_argument("--task", action="append", default=[],
                    help="more task dialogues (segmentation format), all of them in the task share")
    ap.add_argument("--subjects", action="append", default=[],
                    help="more subject histories, all of them in the subjects share")
    ap.add_argument("--c", type=float, default=C, help="L2 strength")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    from sklearn.linear_model import LogisticRegression

    from arbormem.embed import make_embedder

    emb = make_embedder("local")
    task = json.loads((ROOT / "benchmarks/data/taskseg_dev.json").read_text())
    subjects = json.loads((ROOT / "benchmarks/data/subjects_dev.json").read_text())
    more_task = [d for f in (*(ROOT / "benchmarks/data" / n for n in TASK_SETS), *args.task)
                 for d in json.loads(Path(f).read_text())]
    more_subjects = [h for f in args.subjects for h in json.loads(Path(f).read_text())]
    train = [_segmented(json.loads(Path(args.tiage_train).read_text())), _segmented(task[0::2] + more_task),
             _sessions(subjects[:2] + more_subjects)]
    held = {"task (odd)": _segmented(task[1::2]), "subjects (last two)": _sessions(subjects[2:])}
    if args.dev:
        held["tiage dev"] = _segmented(json.loads(Path(args.dev).read_text()))
    xs, ys, ws = [], [], []
    for part in train:
        x, y = _matrix(emb, part)
        xs.append(x)
        ys.append(y)
        ws.append(np.full(len(y), 1000.0 / len(y)))  # one equal share per corpus
    clf = LogisticRegression(C=args.c, max_iter=5000).fit(np.concatenate(xs), np.concatenate(ys), sample_weight=np.concatenate(ws))
    for name, part in held.items():
        x, y = _matrix(emb, part)
        p = clf.predict_proba(x)[:, 1] > THRESHOLD
        tp, fp, fn = int((p & (y == 1)).sum()), int((p & (y == 0)).sum()), int((~p & (y == 1)).sum())
        print(f"{name}: boundary F1 {2 * tp / max(1, 2 * tp + fp + fn):.3f} ({len(y)} exchanges, {int(y.sum())} boundaries)")
    Path(args.out).write_text(json.dumps({
        "about": "organize/shift.py: logistic weights over FEATURES then the all-MiniLM-L6-v2 vector; "
                 "written by scripts/train_shift_head.py",
        "bias": round(float(clf.intercept_[0]), 6),
        "weights": [round(float(w), 6) for w in clf.coef_[0]],
    }, indent=None) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
