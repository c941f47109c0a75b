#!/usr/bin/env python3
"""Build DialSeg711-style concatenated task dialogues from task_subdialogues.json.

Each output dialogue concatenates 3-6 independent sub-dialogues; two adjacent
sub-dialogues never share a domain, a sub-dialogue is used at most 3 times
overall (and at most once per dialogue). Deterministic (seed 7, stdlib only).
Selection is weighted by remaining uses so the pool is spread evenly; if the
greedy construction runs into a dead end the whole build is restarted with the
same RNG stream (still deterministic).
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "task_subdialogues.json")
OUT = os.path.join(HERE, "taskseg_dev.json")
N_DIALOGUES = 80
MIN_SUBS, MAX_SUBS = 3, 6
MAX_USES = 3
SEED = 7


def build(subs, rng):
    uses = [0] * len(subs)
    plan = []
    for _ in range(N_DIALOGUES):
        k = rng.randint(MIN_SUBS, MAX_SUBS)
        chosen = []
        for _ in range(k):
            prev_dom = subs[chosen[-1]]["domain"] if chosen else None
            cands = [i for i in range(len(subs))
                     if uses[i] < MAX_USES and i not in chosen
                     and subs[i]["domain"] != prev_dom]
            if not cands:
                return None
            weights = [MAX_USES - uses[i] for i in cands]
            pick = rng.choices(cands, weights=weights, k=1)[0]
            chosen.append(pick)
            uses[pick] += 1
        plan.append(chosen)
    return plan


def main():
    subs = json.load(open(SRC, encoding="utf-8"))
    rng = random.Random(SEED)
    plan = None
    for _attempt in range(1000):
        plan = build(subs, rng)
        if plan is not None:
            break
    if plan is None:
        raise SystemExit("could not satisfy constraints")
    out = []
    for i, chosen in enumerate(plan):
        utts, segs = [], []
        for j in chosen:
            utts.extend(subs[j]["utterances"])
            segs.append(len(subs[j]["utterances"]))
        out.append({"dial_id": i, "utterances": utts, "segments": segs,
                    "set": "synthetic-dev",
                    # extra provenance (index into task_subdialogues.json)
                    "source_ids": chosen,
                    "domains": [subs[j]["domain"] for j in chosen]})
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
    n_seg = sum(len(d["segments"]) for d in out)
    n_utt = sum(len(d["utterances"]) for d in out)
    print(f"wrote {len(out)} dialogues to {OUT}: "
          f"mean segments {n_seg / len(out):.2f}, mean utterances {n_utt / len(out):.1f}")


if __name__ == "__main__":
    main()
