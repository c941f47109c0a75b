"""The process the crash tests kill: ingests into a SQLite memory until SIGKILLed.

Run as ``python crash_child.py DB LOG SEED``. After each write call RETURNS, one line is
appended to LOG and fsynced before the next call: ``done ID TOKEN $`` for an exchange that
``add``/``add_many``/``complete`` stored, ``pending ID $`` after ``begin``. The parent may
therefore demand every ``done`` exchange after the kill; a call that was cut short may or
may not have committed, but must be all there or not at all. Every exchange carries a unique
TOKEN so the parent can find it by search.
"""

from __future__ import annotations

import os
import random
import sys


def main() -> None:
    db, log_path, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    from arbormem import Memory

    rng = random.Random(seed)
    subjects = ["garden tomatoes", "rust borrow checker", "marathon training", "mortgage rates",
                "jazz chords", "kitten vaccinations", "sql query plans", "greek islands"]
    log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 - must outlive every call

    def report(line: str) -> None:
        # The " $" closes a whole line: a kill inside a write can leave a torn line, which the
        # parent must not read as a report (a token cut short would be searched for in vain).
        log.write(line + " $\n")
        log.flush()
        os.fsync(log.fileno())

    # A line torn by the previous kill ends here, instead of running into this run's lines.
    log.write("\n")

    n = 0

    def item(user: str) -> tuple[str, list[dict[str, str]]]:
        nonlocal n
        n += 1
        token = f"zq{seed}k{n}"
        subject = subjects[rng.randrange(len(subjects))]
        body = " ".join(rng.choice(subject.split() + ["why", "how", "notes"]) for _ in range(rng.randint(3, 40)))
        return token, [{"role": "user", "content": f"{subject} {token} {body}"},
                       {"role": "assistant", "content": f"about {subject}: {body[::-1]}"}]

    # ARBORMEM_CRASH_EMBED_DELAY: seconds each embedder call takes (the same hash vectors and
    # recorded model), so that background placement has a queue when the kill comes.
    delay = float(os.environ.get("ARBORMEM_CRASH_EMBED_DELAY", "0"))
    mem = Memory(db, embedder=_slow_hash(delay) if delay else "hash")
    report("ready")
    while True:
        user = f"user{rng.randrange(2)}"
        op = rng.random()
        if op < 0.4:
            token, msgs = item(user)
            ex = mem.add(msgs, user_id=user, session_id=f"s{rng.randrange(3)}")
            report(f"done {ex.id} {token}")
        elif op < 0.7:
            token, msgs = item(user)
            ex = mem.begin(msgs[0]["content"], user_id=user)
            report(f"pending {ex.id}")
            ex = mem.complete(ex.id, msgs[1]["content"])
            report(f"done {ex.id} {token}")
        elif op < 0.93:
            batch = [item(user) for _ in range(rng.randint(2, 30))]
            out = mem.add_many([{"messages": m} for _, m in batch], user_id=user,
                               batch_size=rng.choice([4, 16, 256]))
            for ex, (token, _) in zip(out, batch, strict=True):
                report(f"done {ex.id} {token}")
        else:
            mem.consolidate(user)


def _slow_hash(delay: float):  # noqa: ANN202 - a test helper class made on demand
    import time

    from arbormem.embed.testing import HashEmbedder

    class SlowHash(HashEmbedder):
        def embed_batch(self, texts):  # noqa: ANN001, ANN202
            time.sleep(delay)
            return super().embed_batch(texts)

    return SlowHash()


if __name__ == "__main__":
    main()
