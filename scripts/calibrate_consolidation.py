"""Calibrate the consolidation thresholds for an embedder (default: the bundled MiniLM).

Measures cosine distributions of topic centroids on the LoCoMo dialogues, as arbormem builds
them (no LLM): (a) each frozen topic's nearest other topic in the same conversation (the
candidates a merge would look at), (b) topic pairs from different conversations (different
people's lives: a merge threshold must sit well above these), and (c) exchange pairs: nearest
exchange in the same conversation vs exact re-sends (near-duplicate threshold).

Usage: .venv/bin/python scripts/calibrate_consolidation.py [--embedder hash] [LOCOMO_FILES...]
"""
import argparse
import glob
import random

import numpy as np

from arbormem import Memory
from arbormem.eval.locomo import load_conversations
from arbormem.eval.runner import ingest_conversation

ap = argparse.ArgumentParser()
ap.add_argument("--embedder", default="local")
ap.add_argument("files", nargs="*")
args = ap.parse_args()
files = sorted(args.files) or sorted(glob.glob("../shared/data/locomo/*.json"))
convs = load_conversations(files)
mem = Memory(":memory:", embedder=args.embedder)
cents: dict[str, np.ndarray] = {}
for c in convs:
    uid = f"c{c.id}"
    ingest_conversation(mem, c, uid)
    recs = [r for r in mem.store.list_topics(uid) if r.kind == "topic" and r.centroid() is not None]
    cents[uid] = np.stack([r.centroid() for r in recs])


def pct(name: str, xs: list[float]) -> None:
    a = np.array(xs)
    print(f"{name:44} n={len(a):6d} " + " ".join(f"p{p}={np.percentile(a, p):.3f}" for p in (10, 50, 90, 95, 99)))


nn_same, cross = [], []
rng = random.Random(0)
for uid, C in cents.items():
    S = C @ C.T
    np.fill_diagonal(S, -1)
    nn_same += list(S.max(axis=1))
    for other, D in cents.items():
        if other != uid:
            cross += list((C @ D.T).ravel())
pct("topic: nearest topic, same conversation", nn_same)
pct("topic: any pair, different conversations", cross)
pct("topic: nearest topic, other conversation", [float(np.max(C @ D.T, axis=1).max()) for u, C in cents.items() for o, D in cents.items() if o != u])
for thr in (0.6, 0.65, 0.7, 0.75, 0.8, 0.85):
    print(f"  threshold {thr}: share of same-conversation NN above = {np.mean(np.array(nn_same) >= thr):.3f}, "
          f"cross-conversation pairs above = {np.mean(np.array(cross) >= thr):.5f}")
# exchanges: nearest other exchange in the conversation (distinct content) vs light edits
ex_nn = []
edits = []
for c in convs:
    texts = [u.text() for u in c.units()]
    V = mem.embedder.embed(texts)
    S = V @ V.T
    np.fill_diagonal(S, -1)
    ex_nn += list(S.max(axis=1))
    variants = [t.rstrip(".!?") + "!" if i % 2 else "  " + t.lower() for i, t in enumerate(texts[:200])]
    W = mem.embedder.embed(variants)
    edits += list(np.sum(V[:200] * W, axis=1))
pct("exchange: nearest other exchange", ex_nn)
pct("exchange: same text re-sent with case/punct edits", edits)
