"""A process of the concurrency test: THREADS threads mixing writes and reads on one memory.

Run as ``python concurrency_worker.py DB TAG THREADS OPS``; prints one JSON line:
``{"ids": {user: [ids written]}, "errors": [repr of every exception]}``.
"""

from __future__ import annotations

import json
import random
import sys
import threading


def run(db: str, tag: str, threads: int, ops: int) -> dict[str, object]:
    from arbormem import Memory

    mem = Memory(db, embedder="hash")
    ids: dict[str, list[str]] = {"ann": [], "ben": []}
    errors: list[str] = []
    lock = threading.Lock()

    def work(t: int) -> None:
        rng = random.Random(f"{tag}-{t}")
        for i in range(ops):
            user = rng.choice(["ann", "ben"])
            text = f"{tag} thread {t} op {i} about {rng.choice(['tea', 'bikes', 'chess'])}"
            try:
                r = rng.random()
                if r < 0.45:
                    ex = mem.add([{"role": "user", "content": text},
                                  {"role": "assistant", "content": "noted " + text}], user_id=user)
                    new = [ex.id]
                elif r < 0.6:
                    ex = mem.begin(text, user_id=user)
                    new = [mem.complete(ex.id, "reply " + text).id]
                elif r < 0.7:
                    out = mem.add_many([{"messages": [{"role": "user", "content": f"{text} {k}"},
                                                      {"role": "assistant", "content": "ok then"}]}
                                        for k in range(rng.randint(2, 6))], user_id=user)
                    new = [e.id for e in out]
                elif r < 0.74:
                    mem.consolidate(user)  # the organiser's pass, beside the writers
                    new = []
                elif r < 0.87:
                    assert mem.recall(text, user_id=user, max_tokens=300).text
                    new = []
                else:
                    mem.search(text, user_id=user, limit=5)
                    new = []
                with lock:
                    ids[user].extend(new)
            except Exception as exc:  # every failure is reported to the parent, none hidden
                with lock:
                    errors.append(repr(exc))

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    mem.close()
    return {"ids": ids, "errors": errors}


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
