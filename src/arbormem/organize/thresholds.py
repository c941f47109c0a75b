"""Cosine thresholds of consolidation, one set per embedder (docs/consolidation.md has the
measurements and scripts/calibrate_consolidation.py the method)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Thresholds:
    """Cosine thresholds of one embedder (see docs/consolidation.md for the measurements)."""

    merge: float       # topic centroid vs topic centroid: merge candidate
    link: float        # ... cross-link candidate (below merge)
    duplicate: float   # exchange vs exchange: near-duplicate candidate (then a word check)
    supersede: float   # exchange vs an older exchange: update candidate (then cue + entity)
    tag: float         # tag vs tag: same meaning


#: Measured with scripts/calibrate_consolidation.py on the LoCoMo development dialogues.
#: MiniLM: topic pairs from different conversations (different people's lives) never exceed
#: 0.75 (p99 0.69), the nearest topic in the same conversation has p50 0.88; merge at 0.80
#: sits above every cross-conversation pair observed, link at 0.70 above their p99.
THRESHOLDS: dict[str, Thresholds] = {
    "minilm": Thresholds(merge=0.80, link=0.70, duplicate=0.95, supersede=0.55, tag=0.80),
    # HashEmbedder: cosine is word overlap; unrelated texts are near 0.
    "hash": Thresholds(merge=0.55, link=0.35, duplicate=0.95, supersede=0.30, tag=0.95),
}
#: Any other embedder: the MiniLM values (sentence-transformers models have similar scales);
#: calibrate with the script and pass ``ConsolidationOptions(thresholds=...)``.
DEFAULT_THRESHOLDS = THRESHOLDS["minilm"]


def thresholds_for(embedder_name: str) -> Thresholds:
    """The calibrated thresholds for an embedder, by its ``name``."""
    name = embedder_name.lower()
    if name.startswith("hash"):
        return THRESHOLDS["hash"]
    if "minilm" in name:
        return THRESHOLDS["minilm"]
    return DEFAULT_THRESHOLDS



__all__ = ["DEFAULT_THRESHOLDS", "THRESHOLDS", "Thresholds", "thresholds_for"]
