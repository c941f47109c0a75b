"""Calibrate the relevance floor (``min_relevance``; docs/recall.md, "Relevance floor").

The floor gates a query on its best candidate's relevance (dense cosine + 0.3 x the share of
the query's terms one message holds). Here, on LoCoMo-style conversations:

- answerable: each conversation's memory asked its own questions (the floor must let them
  through: a question gated out loses all its evidence);
- null: each conversation's memory asked the other conversations' questions (nothing in it
  answers them: the floor should gate them out).

The floor is chosen leave-one-conversation-out: on the pairs that do not involve conversation
C, the highest floor on a grid that still lets at least 99% of the answerable questions
through; that floor is then scored on the pairs that involve C only (its own questions, its
memory asked the others' questions, the others' memories asked its questions). Memory size:
the same rates on memories of two conversations pooled (twice as large), asked the third
conversation's questions (null) and their own (answerable).

Usage: PYTHONPATH=src python scripts/calibrate_relevance.py ../shared/data/locomo/*.json
(~3 min on 2 cores with the bundled MiniLM). Nothing here refers to the conversations' names
or wording; the numbers it prints are in docs/recall.md.
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np

from arbormem import Memory
from arbormem.embed.local import MINILM_RELEVANCE_FLOOR
from arbormem.eval.locomo import load_conversations
from arbormem.eval.runner import ingest_conversation

GRID = [round(x, 3) for x in np.arange(0.30, 0.651, 0.01)]
KEEP = 0.99  # answerable questions the floor must let through


def best_relevance(mem: Memory, user: str, question: str) -> float:
    """The query's best candidate relevance (the floor is off, so nothing is gated)."""
    return mem.recall(question, user_id=user, max_tokens=64, recent=0, min_relevance=0).trace.best_relevance


def pick(own: list[float], null: list[float]) -> float:
    """The highest grid floor that keeps KEEP of the answerable questions."""
    ok = [t for t in GRID if np.mean([x >= t for x in own]) >= KEEP]
    return max(ok) if ok else GRID[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--db", default=":memory:")
    ap.add_argument("--embedder", default="local")
    args = ap.parse_args()
    convs = load_conversations(args.files)
    with Memory(args.db, embedder=args.embedder) as mem:
        for c in convs:
            mem.delete_user(f"cal-{c.id}")
            ingest_conversation(mem, c, f"cal-{c.id}")
        # rel[(memory, question conversation)] = best relevance per question
        rel = {(m.id, q.id): [best_relevance(mem, f"cal-{m.id}", x.question) for x in q.scored_questions()]
               for m in convs for q in convs}
        print("conversation-held-out calibration (floor chosen without C, scored on pairs with C):")
        print("held out | floor | answerable through | null gated out")
        for c in convs:
            rest = [x.id for x in convs if x.id != c.id]
            own = [v for m in rest for v in rel[(m, m)]]
            null = [v for m in rest for q in rest if q != m for v in rel[(m, q)]]
            t = pick(own, null)
            h_own = rel[(c.id, c.id)]
            h_null = [v for m in convs for q in convs if m.id != q.id and c.id in (m.id, q.id) for v in rel[(m.id, q.id)]]
            print(f"{c.id} | {t:.2f} | {np.mean([x >= t for x in h_own]):.3f} ({len(h_own)}) | "
                  f"{np.mean([x < t for x in h_null]):.3f} ({len(h_null)})")
        own_all = [v for m in convs for v in rel[(m.id, m.id)]]
        null_all = [v for m in convs for q in convs if m.id != q.id for v in rel[(m.id, q.id)]]
        print(f"all pooled: answerable best relevance p1/p5/p50 "
              f"{' / '.join(f'{np.percentile(own_all, p):.3f}' for p in (1, 5, 50))}; "
              f"null p50/p90/p95 {' / '.join(f'{np.percentile(null_all, p):.3f}' for p in (50, 90, 95))}")
        for t in (0.40, 0.42, 0.45, 0.48, 0.50):
            print(f"floor {t:.2f}: answerable through {np.mean([x >= t for x in own_all]):.3f}, "
                  f"null gated out {np.mean([x < t for x in null_all]):.3f}")
        print("memory size: two conversations pooled in one memory")
        for a, b in itertools.combinations(convs, 2):
            third = [x for x in convs if x.id not in (a.id, b.id)]
            user = f"cal-{a.id}+{b.id}"
            mem.delete_user(user)
            ingest_conversation(mem, a, user)
            ingest_conversation(mem, b, user)
            own = [best_relevance(mem, user, x.question) for x in (*a.scored_questions(), *b.scored_questions())]
            null = [best_relevance(mem, user, x.question) for z in third for x in z.scored_questions()]
            single_null = [v for z in third for m in (a, b) for v in rel[(m.id, z.id)]]
            for t in (0.45, MINILM_RELEVANCE_FLOOR):
                print(f"{a.id}+{b.id} ({len(a.units()) + len(b.units())} exchanges), floor {t}: answerable through "
                      f"{np.mean([x >= t for x in own]):.3f}, null gated out {np.mean([x < t for x in null]):.3f} "
                      f"(the same questions on each conversation alone: {np.mean([x < t for x in single_null]):.3f})")
            mem.delete_user(user)


if __name__ == "__main__":
    main()
