"""A learned topic-shift cue for the bundled embedder: does an exchange open a new topic?

Placement's plain rule (``TreeSession.place``) continues the open topic while an exchange's
average link (mean cosine) to it stays above ``continue_threshold``. On chit-chat that rule
is no better than random boundaries (TIAGE, Pk 0.461 against 0.430): small talk moves
between loosely related remarks, and a cosine cannot tell "what is your favourite season?"
(a new topic) from "cool, what did you win it for?" (the same one). What tells them apart is
partly in the words and the form of the message, which a cosine of two vectors throws away.

The shift head is a logistic regression over what placement knows when the exchange arrives,
without waiting for the next one:

* the exchange's cosine to the previous exchange and its mean cosine to the previous two
  (same session);
* the form of the user's message: a question, a question word or a discourse marker first
  ("so", "anyway", "by the way"), "favourite", "you/your", its length;
* whether the previous reply asked a question (the message then usually answers it);
* the exchange's own vector (384 numbers): what kind of message opens a topic.

It was trained by ``scripts/train_shift_head.py`` on development data only, one share per
corpus so that no style dominates: TIAGE's training dialogues (chit-chat), the even-numbered
task dialogues of ``benchmarks/data/taskseg_dev.json`` with the three earlier blind task sets
(``taskseg_check*.json``: more task styles, docs/tree.md "More task styles") and the first two
subject histories of
``benchmarks/data/subjects_dev.json`` (a boundary wherever the subject changes within a
session). The held-out halves and TIAGE's dev split measure it (docs/tree.md, "The shift
head"). The weights hold for the bundled all-MiniLM-L6-v2 only (they read its vectors), so an
embedder names the head it can use (``Embedder.shift_head``); any other model keeps the plain
rule.
"""

from __future__ import annotations

import json
import math
import re
import threading
from dataclasses import dataclass
from importlib import resources

import numpy as np

#: The hand-made features, in the order of the weights file (the vector's follow).
FEATURES = ("cos_prev", "cos_prev2", "question", "question_word_first", "favourite",
            "prev_reply_asks", "prev_reply_has_question", "length", "addresses_you", "marker_first")
_QUESTION_WORD = re.compile(r"(what|which|how|do|does|did|have|has|are|is|were|was|where|who|why|any|can|would|if)\b")
_MARKER = re.compile(r"(so|anyway|by the way|well|btw|oh|speaking of|ok|okay)\b")
_YOU = re.compile(r"\b(you|your)\b")
#: Words of the user's message counted by ``length`` (capped: past it a message is "long").
LENGTH_CAP = 30


@dataclass(frozen=True)
class ShiftHead:
    """Logistic weights over ``features``: ``probability`` that an exchange opens a topic."""

    name: str
    weights: np.ndarray
    bias: float

    def probability(self, vec: np.ndarray, prev: np.ndarray | None, prev2: np.ndarray | None,
                    user_text: str, prev_reply: str) -> float | None:
        """The chance that the exchange (vector ``vec``, user message ``user_text``) starts a
        new topic after ``prev`` and ``prev2`` (the previous two exchanges' vectors in the
        session, None when absent) and the previous reply ``prev_reply``; None for vectors of
        another size (another model's: the head does not apply)."""
        x = features(vec, prev, prev2, user_text, prev_reply)
        if x.shape != self.weights.shape:
            return None
        z = float(x @ self.weights) + self.bias
        return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))


def features(vec: np.ndarray, prev: np.ndarray | None, prev2: np.ndarray | None,
             user_text: str, prev_reply: str) -> np.ndarray:
    """The head's input: ``FEATURES`` then the exchange's vector (float32)."""
    user = user_text.lower().strip()
    reply = prev_reply.lower().strip()
    vec = vec.astype(np.float32, copy=False)
    c1 = float(vec @ prev) if prev is not None else 0.0
    c2 = float(vec @ (prev + prev2)) / 2 if prev is not None and prev2 is not None else c1
    hand = [c1, c2, float("?" in user), float(bool(_QUESTION_WORD.match(user))),
            float("favorite" in user or "favourite" in user), float(reply.endswith("?")),
            float("?" in reply), min(len(user.split()), LENGTH_CAP) / LENGTH_CAP,
            float(bool(_YOU.search(user))), float(bool(_MARKER.match(user)))]
    return np.concatenate([np.array(hand, dtype=np.float32), vec])


_HEADS: dict[str, ShiftHead] = {}
_LOCK = threading.Lock()


def load_head(name: str) -> ShiftHead:
    """The bundled head ``name`` (``data/shift_<name>.json``), read once per process."""
    head = _HEADS.get(name)
    if head is None:
        with _LOCK:
            head = _HEADS.get(name)
            if head is None:
                raw = json.loads(resources.files("arbormem").joinpath(f"data/shift_{name}.json").read_text())
                head = ShiftHead(name, np.asarray(raw["weights"], dtype=np.float32), float(raw["bias"]))
                _HEADS[name] = head
    return head


__all__ = ["FEATURES", "ShiftHead", "features", "load_head"]
