"""Cold start (issue 20): how long until a fresh process can write, and until a freshly started
`arbormem serve` answers its first recall, with the bundled local model.

    python scripts/cold_start.py --runs 3 [--breakdown]

Each run is a new process. "memory": import arbormem, Memory(path), the first add (which loads
the embedding model), a second add, the first recall. "serve": spawn `arbormem serve` on a
memory made beforehand, poll /health until it answers, then send a recall at once (a client
that does not wait for ready) and a write. The arbormem imported by this script is the one
measured (PYTHONPATH selects a tree; BENCHMARKS.md measured an older commit through
`git archive COMMIT src | tar -x -C /tmp/before` and PYTHONPATH=/tmp/before/src).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MEMORY = r"""
import json, os, sys, tempfile, time
t0 = time.perf_counter()
from arbormem import Memory
t1 = time.perf_counter()
m = Memory(os.path.join(tempfile.mkdtemp(), "m.db"))
t2 = time.perf_counter()
m.add([{"role": "user", "content": "Leo is allergic to peanuts"}, {"role": "assistant", "content": "Noted."}], user_id="u")
t3 = time.perf_counter()
m.add([{"role": "user", "content": "We go to Kyoto in May"}, {"role": "assistant", "content": "Nice."}], user_id="u")
t4 = time.perf_counter()
m.recall("peanuts?", user_id="u")
t5 = time.perf_counter()
print(json.dumps({"import_s": round(t1 - t0, 2), "memory_s": round(t2 - t1, 2), "first_add_s": round(t3 - t2, 2),
                  "second_add_s": round(t4 - t3, 3), "first_recall_s": round(t5 - t4, 3),
                  "to_first_write_s": round(t3 - t0, 2)}))
"""

BREAKDOWN = r"""
import json, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
torch.set_num_threads(1)
from arbormem.embed.bert import BertEncoder
from arbormem.embed.local import bundled_model_path
e = BertEncoder(bundled_model_path())
t2 = time.perf_counter()
e.encode(["hello world"])
t3 = time.perf_counter()
import sentence_transformers  # what the model load imported before embed/bert.py
t4 = time.perf_counter()
print(json.dumps({"import_torch_s": round(t1 - t0, 2), "load_weights_s": round(t2 - t1, 2),
                  "first_encode_s": round(t3 - t2, 3), "import_sentence_transformers_s": round(t4 - t3, 2)}))
"""

SEED = r"""
import sys
from arbormem import Memory
with Memory(sys.argv[1]) as m:
    m.add([{"role": "user", "content": "Leo is allergic to peanuts"}, {"role": "assistant", "content": "Noted."}], user_id="u")
"""


def serve_once(env: dict[str, str], db: str) -> dict[str, object]:
    import httpx

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    url = f"http://127.0.0.1:{port}"
    auth = {"Authorization": "Bearer tok"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "arbormem.cli", "serve", "--db", db, "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                httpx.get(url + "/health", timeout=5)
                break
            except httpx.TransportError:
                if proc.poll() is not None:
                    raise RuntimeError("arbormem serve exited") from None
                time.sleep(0.05)
        t_health = time.perf_counter() - t0
        r = httpx.post(url + "/v1/users/u/recall", json={"query": "snacks for Leo?", "max_tokens": 200},
                       headers=auth, timeout=300)
        t_recall = time.perf_counter() - t0
        assert r.status_code == 200 and "peanuts" in r.json()["text"], r.text
        w = httpx.post(url + "/v1/users/u/exchanges", headers=auth, timeout=300,
                       json={"messages": [{"role": "user", "content": "Kyoto in May"}, {"role": "assistant", "content": "ok"}]})
        assert w.status_code == 201, w.text
        return {"health_up_s": round(t_health, 2), "first_recall_s": round(t_recall, 2),
                "then_write_s": round(time.perf_counter() - t0 - t_recall, 3),
                "health": httpx.get(url + "/health").json()}
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--breakdown", action="store_true",
                    help="Also time torch's import, the weights, the first encode and sentence-transformers' import.")
    args = ap.parse_args()
    import arbormem

    src = str(Path(arbormem.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src, "ARBORMEM_API_TOKENS": "tok:u"}
    for key in ("ARBORMEM_EMBEDDER", "ARBORMEM_DATABASE_URL", "ARBORMEM_LLM__BASE_URL"):
        env.pop(key, None)
    print(json.dumps({"arbormem": src, "load_average": os.getloadavg()}))
    for _ in range(args.runs):
        out = subprocess.run([sys.executable, "-c", MEMORY], env=env, capture_output=True, text=True, check=True)
        print(json.dumps({"memory": json.loads(out.stdout.strip().splitlines()[-1])}), flush=True)
        if args.breakdown:
            out = subprocess.run([sys.executable, "-c", BREAKDOWN], env=env, capture_output=True, text=True, check=True)
            print(json.dumps({"breakdown": json.loads(out.stdout.strip().splitlines()[-1])}), flush=True)
    db = os.path.join(tempfile.mkdtemp(), "serve.db")
    subprocess.run([sys.executable, "-c", SEED, db], env=env, check=True, capture_output=True)
    for _ in range(args.runs):
        print(json.dumps({"serve": serve_once(env, db)}), flush=True)


if __name__ == "__main__":
    main()
