"""Scale check for recall: every LoCoMo conversation given in ONE user's memory.

`arbormem eval locomo` gives each conversation its own memory (188-340 exchanges on the
development split). This puts them all in one memory, a haystack several times larger, and
scores arbormem against the flat hybrid (BM25 + MiniLM, RRF) over the same pooled exchanges,
so one can see whether the lead holds as memory grows. It measures; tune nothing on it.

Usage: .venv/bin/python scripts/pooled_haystack.py [LOCOMO_FILES...] [setting=value ...]
  setting=value overrides a RecallSettings field, e.g. topic_lift=0.0 for an ablation.
The memory is a throw-away SQLite file in a temporary directory.
"""
import glob
import sys
import tempfile
from pathlib import Path

import numpy as np

from arbormem.eval.baselines import FlatIndex, pack
from arbormem.eval.locomo import load_conversations
from arbormem.eval.runner import count_tokens, evidence_found, ingest_conversation, render_unit
from arbormem.memory import Memory

BUDGETS = (1024, 2048, 4096)
files = [a for a in sys.argv[1:] if "=" not in a] or sorted(glob.glob("../shared/data/locomo/*.json"))
overrides = [a.split("=", 1) for a in sys.argv[1:] if "=" in a]
convs = load_conversations(files)
with tempfile.TemporaryDirectory() as tmp:
    mem = Memory(str(Path(tmp) / "pooled.db"))
    for key, value in overrides:
        setattr(mem.settings.recall, key, type(getattr(mem.settings.recall, key))(value))
    units = [u for c in convs for u in ingest_conversation(mem, c, "pooled")]
    blocks = [render_unit(u) for u in units]
    costs = [count_tokens(b) for b in blocks]
    flat = FlatIndex([u.text() for u in units], mem.embedder.embed([u.text() for u in units]))
    scores: dict[tuple[str, int], list[float]] = {}
    for c in convs:
        for q in c.scored_questions():
            evidence = [c.turn_index[e].text for e in q.evidence]
            hybrid = flat.rankings(q.question, mem.embedder.embed_one(q.question))["hybrid"]
            for b in BUDGETS:
                r = mem.recall(q.question, user_id="pooled", max_tokens=b)
                scores.setdefault(("arbormem", b), []).append(evidence_found(r.text, evidence) / len(evidence))
                p = pack(hybrid, blocks, costs, b, count_tokens)
                scores.setdefault(("flat hybrid", b), []).append(evidence_found(p.text, evidence) / len(evidence))
    mem.close()

print(f"{len(convs)} conversations pooled: {len(units)} exchanges in one memory; "
      f"{len(scores['arbormem', BUDGETS[0]])} questions; overrides {dict(overrides) or 'none'}")
print("| system | " + " | ".join(str(b) for b in BUDGETS) + " |")
print("|---|" + "---:|" * len(BUDGETS))
for system in ("arbormem", "flat hybrid"):
    print(f"| {system} | " + " | ".join(f"{np.mean(scores[system, b]):.3f}" for b in BUDGETS) + " |")
print("| lead | " + " | ".join(
    f"{np.mean(scores['arbormem', b]) - np.mean(scores['flat hybrid', b]):+.3f}" for b in BUDGETS) + " |")
