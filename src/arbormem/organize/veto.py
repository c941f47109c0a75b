"""The merge veto: two similar topics merge only when a second judge agrees they are one
subject. Offline, a lexical and entity-overlap check (``lexical_veto``); with an LLM, its
verdict (``llm_veto``; no verdict keeps the topics apart). "Python the snake" and "Python the
language" must stay apart however close their centroids are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..models import Exchange
from ..store.base import TopicRecord
from ..text import idf
from .heuristics import names


@dataclass(frozen=True)
class Veto:
    """An offline or LLM verdict on a merge: ``ok`` allows it; ``detail`` goes to the log."""

    ok: bool
    by: str
    detail: dict[str, Any]


def lexical_veto(a: TopicRecord, b: TopicRecord, a_texts: Sequence[str], b_texts: Sequence[str],
                 df: Mapping[str, int], n_docs: int) -> Veto:
    """The offline veto: two topics may merge only when they share at least two specific terms
    (in at most 10% of the user's exchanges), their distinctive terms overlap (tf-idf weighted
    Jaccard >= 0.12) and they do not name disjoint entities.

    One shared word is not a shared subject: "python" alone joins a snake and a language.
    """
    def weights(rec: TopicRecord) -> dict[str, float]:
        w = {t: c * idf(df.get(t, 1), n_docs) for t, c in rec.terms.items()}
        top = sorted(w.items(), key=lambda kv: -kv[1])[:24]
        total = math.sqrt(sum(v * v for _, v in top)) or 1.0
        return {t: v / total for t, v in top}

    wa, wb = weights(a), weights(b)
    shared = sorted(set(wa) & set(wb))
    num = sum(min(wa[t], wb[t]) for t in shared)
    den = sum(max(wa.get(t, 0.0), wb.get(t, 0.0)) for t in set(wa) | set(wb)) or 1.0
    overlap = num / den
    na = set().union(*(names(t) for t in a_texts)) if a_texts else set()
    nb = set().union(*(names(t) for t in b_texts)) if b_texts else set()
    disjoint_names = bool(na) and bool(nb) and not (na & nb)
    # Shared words that most exchanges contain (the speakers' names in a dialogue, "time",
    # "see") say nothing about a shared subject: at least two must be specific.
    specific = [t for t in shared if df.get(t, 1) <= max(2, 0.10 * n_docs)]
    ok = len(specific) >= 2 and overlap >= 0.12 and not disjoint_names
    return Veto(ok, "lexical", {"shared_terms": shared[:12], "specific_terms": specific[:12],
                                "overlap": round(overlap, 3), "disjoint_names": disjoint_names})



def llm_veto(llm: Any, older: TopicRecord, newer: TopicRecord, a_ex: Sequence[Exchange],
             b_ex: Sequence[Exchange]) -> Veto:
    """The LLM's verdict on merging ``newer`` into ``older`` (an ``LLMRunner``)."""
    from ..llm.roles import veto_merge
    from .enrich import to_card, to_turns

    verdict = veto_merge(llm, to_card(older), to_turns(a_ex), to_card(newer), to_turns(b_ex))
    if verdict is None:
        # No verdict (failure, refusal, garbage) keeps the topics apart: doing nothing is safe.
        return Veto(False, "llm", {"verdict": None})
    return Veto(bool(verdict.same_topic), "llm", {"verdict": bool(verdict.same_topic), "reason": verdict.reason})


__all__ = ["Veto", "lexical_veto", "llm_veto"]
