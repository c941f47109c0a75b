"""Calibrate the placement thresholds: MiniLM cosine distributions of adjacent same-session
exchanges (should continue a topic) vs random pairs from different conversations (should not).

Usage: .venv/bin/python scripts/calibrate_thresholds.py [LOCOMO_FILES...]
"""
import glob
import random
import sys

import numpy as np

from arbormem.embed.local import LocalEmbedder
from arbormem.eval.locomo import load_conversations

convs = load_conversations(sorted(sys.argv[1:]) or sorted(glob.glob("../shared/data/locomo/*.json")))
emb = LocalEmbedder()
units = {c.id: c.units() for c in convs}
vec = {cid: emb.embed([u.text() for u in us]) for cid, us in units.items()}
adj, cent, rnd = [], [], []
rng = random.Random(0)
ids = list(units)
for cid, us in units.items():
    V = vec[cid]
    for i in range(1, len(us)):
        if us[i].session == us[i-1].session:
            adj.append(float(V[i] @ V[i-1]))
            # similarity to the centroid of the previous 3 exchanges of the session
            j = [k for k in range(max(0, i-3), i) if us[k].session == us[i].session]
            c = V[j].sum(0)
            c /= np.linalg.norm(c)
            cent.append(float(V[i] @ c))
    other = [o for o in ids if o != cid]
    for _ in range(2000):
        o = rng.choice(other)
        rnd.append(float(V[rng.randrange(len(V))] @ vec[o][rng.randrange(len(vec[o]))]))
for name, xs in (("adjacent same session", adj), ("vs centroid of previous 3", cent), ("random cross-conversation", rnd)):
    xs = np.array(xs)
    print(f"{name:28} n={len(xs):5d} p10={np.percentile(xs,10):.2f} p25={np.percentile(xs,25):.2f} p50={np.percentile(xs,50):.2f} p75={np.percentile(xs,75):.2f} p90={np.percentile(xs,90):.2f}")
