"""Synthetic conversation vocabulary shared by the tree, organiser and re-embedding tests:
subjects whose words share nothing, so placement and merging have a known right answer."""

from __future__ import annotations

from datetime import datetime, timezone

SUBJECTS = {
    "garden": "tomatoes compost seedlings watering greenhouse soil basil",
    "code": "python asyncio pytest refactor deploy docker database",
    "travel": "kyoto tokyo train ryokan temple passport flight",
    "fitness": "marathon running intervals shoes knee stretching pace",
    "music": "piano scales chopin practice metronome recital chords",
    "money": "budget savings mortgage pension invoice taxes interest",
    "food": "sourdough starter flour oven crust hydration loaf",
    "family": "daughter school homework birthday grandparents holiday",
}
MORE_SUBJECTS = {
    **SUBJECTS,
    "health": "doctor allergy headache sleep vitamins appointment",
    "books": "novel chapter author library reading poetry fiction",
}
T0 = datetime(2024, 1, 1, 9, 0, tzinfo=timezone.utc)
