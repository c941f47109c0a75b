"""Exact identifiers: does a query holding an order number find the one exchange holding it?

A synthetic support chat (deterministic for a seed): ``exchanges`` exchanges in sessions of
five, each mentioning one identifier once, in varied wording; most replies do not repeat it.
Identifiers are of the ``kinds`` given, taken in turn: ``order`` (``ord`` + 10 hex digits, the
case reported in issue 19), ``tracking`` (a 12-digit number) and ``product`` (a made-up name:
a rare word). With ``filler`` the identifier sits among that many ordinary sentences of the
same chat (harder: the exchanges look alike to the embedder and BM25 scores the identifier
over a longer text). ``queries`` identifiers, drawn at random, are asked as the bare identifier and
inside a question; one counts as found by ``search`` when its exchange is in the top ``top``
hits, and by ``recall`` when its exchange is in the recalled context. ``arbormem eval
identifiers`` prints the report.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

KINDS = ("order", "tracking", "product")

_ASKS = {
    "order": ["My order {c} still hasn't arrived, can you check?", "I want to cancel order {c}.",
              "Order {c} came with a broken lid.", "Is there a refund for {c} yet?",
              "Please change the delivery address for order {c}.", "Why was {c} charged twice?"],
    "tracking": ["The tracking number {c} shows no movement since Monday.",
                 "Courier says parcel {c} was delivered but I have nothing.",
                 "Can you look up shipment {c}?", "Tracking {c} says returned to sender."],
    "product": ["Does the {c} come with a charger?", "My {c} stopped working after a week.",
                "Is the {c} dishwasher safe?", "How do I reset the {c}?"],
}
_REPLIES = ["I'm sorry about that, let me look into it.", "Thanks, I've passed this to the team.",
            "Understood. You will get an email within two days.", "I can help with that.",
            "Noted, I opened a ticket for you.", "Thanks for your patience."]
_ECHO = ["I found {c} in our system.", "Checking {c} now."]
_QUESTIONS = {"order": "what happened with order {c}?", "tracking": "where is parcel {c}?",
              "product": "what did I say about the {c}?"}
_FILLER = ["I have been a customer for years and this never happened before.",
           "The package was supposed to come on Tuesday.", "I tried calling the hotline but nobody answered.",
           "My neighbour ordered something similar and got it quickly.", "Please let me know what to do next.",
           "The app shows a different status than the email I received.", "It was a gift, so it is urgent.",
           "I paid with my credit card and the money is gone."]
_SYLLABLES = "zor bul vex tri quan mel dor pax ilo fen rux kal oma sen tev".split()


def _code(kind: str, rng: random.Random) -> str:
    if kind == "order":
        return "ord" + "".join(rng.choice("0123456789abcdef") for _ in range(10))
    if kind == "tracking":
        return str(rng.randrange(10**11, 10**12))
    return "".join(rng.choice(_SYLLABLES) for _ in range(3)).capitalize() + str(rng.randrange(2, 9)) + "00"


def dataset(exchanges: int = 300, seed: int = 0, kinds: Sequence[str] = ("order",), filler: int = 0,
            ) -> tuple[list[dict[str, Any]], list[tuple[str, str, int]]]:
    """(add_many items, [(kind, identifier, index of its exchange)])."""
    rng = random.Random(seed)
    start = datetime(2025, 3, 1, 9, tzinfo=timezone.utc)
    items: list[dict[str, Any]] = []
    codes: list[tuple[str, str, int]] = []
    seen: set[str] = set()
    for i in range(exchanges):
        kind = kinds[i % len(kinds)]
        code = _code(kind, rng)
        while code in seen:
            code = _code(kind, rng)
        seen.add(code)
        reply = rng.choice(_REPLIES)
        if rng.random() < 0.3:
            reply = rng.choice(_ECHO).format(c=code) + " " + reply
        ask = rng.choice(_ASKS[kind]).format(c=code)
        if filler:
            around = rng.sample(_FILLER, min(filler, len(_FILLER)))
            cut = rng.randrange(len(around) + 1)
            ask = " ".join([*around[:cut], ask, *around[cut:]])
        items.append({
            "messages": [{"role": "user", "content": ask},
                         {"role": "assistant", "content": reply}],
            "session_id": f"s{i // 5}",
            "at": (start + timedelta(days=i // 5, minutes=3 * (i % 5))).isoformat(),
        })
        codes.append((kind, code, i))
    return items, codes


@dataclass(frozen=True)
class IdentifierReport:
    """Identifiers found, per query form ("bare", "question") and way (search top-k, recall)."""

    exchanges: int
    queries: int
    top: int
    budget: int
    embedder: str
    kinds: tuple[str, ...] = ("order",)
    filler: int = 0
    found: dict[str, int] = field(default_factory=dict)  # "search/bare" -> count
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    missed: dict[str, list[str]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        out = [f"{self.queries} identifiers ({', '.join(self.kinds)}) among {self.exchanges} exchanges"
               f"{f' (with {self.filler} filler sentences)' if self.filler else ''}, embedder {self.embedder}; "
               f"search: exchange in the top {self.top}; recall: exchange in the context at {self.budget} tokens"]
        for key, n in self.found.items():
            kinds = ", ".join(f"{k} {v}" for k, v in self.by_kind.get(key, {}).items())
            out.append(f"  {key:<16} {n}/{self.queries}  ({kinds})")
        return out


def run(memory_factory: Callable[[], Any], *, exchanges: int = 300, queries: int = 100, top: int = 5,
        budget: int = 1024, seed: int = 0, kinds: Sequence[str] = ("order",), filler: int = 0) -> IdentifierReport:
    """Ingest the dataset into a fresh memory and ask ``queries`` identifiers (drawn at random
    with ``seed``) in both forms."""
    items, codes = dataset(exchanges, seed, kinds, filler)
    asked = [codes[i] for i in sorted(random.Random(seed + 1).sample(range(len(codes)), min(queries, len(codes))))]
    found: dict[str, int] = {}
    by_kind: dict[str, dict[str, int]] = {}
    missed: dict[str, list[str]] = {}
    with memory_factory() as mem:
        stored = mem.add_many(items, user_id="ids")
        for kind, code, idx in asked:
            target = stored[idx].id
            for form, query in (("bare", code), ("question", _QUESTIONS[kind].format(c=code))):
                hits = [h.exchange.id for h in mem.search(query, user_id="ids", limit=top)]
                recalled = {e.id for e in mem.recall(query, user_id="ids", max_tokens=budget).exchanges}
                for way, ok in (("search", target in hits), ("recall", target in recalled)):
                    key = f"{way}/{form}"
                    found[key] = found.get(key, 0) + ok
                    by_kind.setdefault(key, {k: 0 for k in kinds})[kind] += ok
                    if not ok:
                        missed.setdefault(key, []).append(code)
        name = mem.embedder.spec
    return IdentifierReport(exchanges=exchanges, queries=len(asked), top=top, budget=budget, embedder=name,
                            kinds=tuple(kinds), filler=filler, found=found, by_kind=by_kind, missed=missed)


__all__ = ["IdentifierReport", "dataset", "run", "KINDS"]
