"""`arbormem eval topics` / `eval subjects` and the segmentation metrics."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from arbormem.cli import main
from arbormem.eval import segmetrics as sm
from arbormem.eval.topics import names_subject


def test_metrics_on_known_cases() -> None:
    gold = sm.labels_from_segments([4, 4])
    assert sm.pk(gold, gold) == 0.0 and sm.window_diff(gold, gold) == 0.0
    assert sm.pk(gold, [0] * 8) > 0
    assert sm.v_measure(gold, gold)[2] == 1.0
    assert sm.boundary_prf(gold, gold) == (1, 1, 1)
    assert sm.texttiling(__import__("numpy").eye(4, dtype="float32")) is not None


def test_eval_topics_and_subjects_cli(tmp_path: Path) -> None:
    seg = [{"utterances": ["i need a hotel in the north", "the north has 3 hotels", "book it for two",
                           "booked for two", "what is the weather in paris", "paris is sunny",
                           "and tomorrow in paris", "rain tomorrow in paris"], "segments": [4, 4]}]
    f = tmp_path / "seg.json"
    f.write_text(json.dumps(seg))
    out = tmp_path / "rep.json"
    r = CliRunner().invoke(main, ["eval", "topics", str(f), "--embedder", "hash", "--json", str(out)])
    assert r.exit_code == 0, r.output
    rep = json.loads(out.read_text())
    assert {row["system"] for row in rep["rows"]} == {"arbormem", "texttiling", "random", "one segment", "every exchange"}
    assert "| arbormem |" in r.output
    hist = [{"name": "h", "exchanges": [
        {"session": "s1", "at": "2025-01-01T10:00:00+00:00", "user": "tomatoes compost allotment", "assistant": "compost the allotment", "subject": "garden"},
        {"session": "s1", "at": "2025-01-01T10:05:00+00:00", "user": "allotment tomatoes watering", "assistant": "water tomatoes", "subject": "garden"},
        {"session": "s2", "at": "2025-01-03T10:00:00+00:00", "user": "rust borrow checker", "assistant": "borrow checker rules", "subject": "rust"},
    ]}]
    h = tmp_path / "hist.json"
    h.write_text(json.dumps(hist))
    r = CliRunner().invoke(main, ["eval", "subjects", str(h), "--embedder", "hash", "--no-shift-head"])
    assert r.exit_code == 0, r.output
    assert "top-level V" in r.output and "h, as placed:" in r.output and "titles repeating their theme" in r.output
    assert "h, after one consolidation run:" in r.output
    # The garden branch (two exchanges) is titled from its words; "Allotment" names the
    # subject only by the title its writer gave it, not by its label "garden".
    assert "top-level titles naming their subject" in r.output
    assert "| 0 / 1 |" in r.output.splitlines()[2], r.output.splitlines()[2]
    assert "one-offs as one subject" in r.output
    hist[0]["subject_titles"] = {"garden": "Allotment tomatoes", "rust": "Learning Rust"}
    h.write_text(json.dumps(hist))
    r = CliRunner().invoke(main, ["eval", "subjects", str(h), "--embedder", "hash", "--no-shift-head", "--no-trees"])
    assert r.exit_code == 0, r.output
    assert "| 1 / 1 |" in r.output.splitlines()[2], r.output


def test_a_title_names_its_subject_by_a_shared_word() -> None:
    assert names_subject("Hip replacement", "des-hip-replacement")
    assert names_subject("Sea kayaking course", "sea-kayaking")
    assert names_subject("Mum's cataract", "Mum's eye operation")
    assert names_subject("Geography joke", "misc:geography-joke")
    assert not names_subject("Surgeon", "des-hip-replacement")
    assert not names_subject("Songs", "ukulele")
    assert not names_subject("Trip", "misc:the-joke")  # function words and "misc" are not words of it


def test_eval_topics_refuses_a_bad_file(tmp_path: Path) -> None:
    f = tmp_path / "bad.json"
    f.write_text(json.dumps([{"utterances": ["a", "b"], "segments": [3]}]))
    r = CliRunner().invoke(main, ["eval", "topics", str(f), "--embedder", "hash"])
    assert r.exit_code != 0 and "segments" in r.output


def test_one_offs_count_as_one_subject_in_the_odds_columns(tmp_path: Path) -> None:
    """Two one-off questions left apart at the top level: each its own subject, a perfect
    grouping; as one subject, "odds and ends" (issue 17's example history), split in two."""
    from arbormem import Memory
    from arbormem.eval.topics import eval_subjects

    rows = [
        {"session": "s1", "at": "2025-01-01T10:00:00+00:00", "subject": "garden",
         "user": "tomatoes compost allotment", "assistant": "compost the allotment"},
        {"session": "s1", "at": "2025-01-01T10:05:00+00:00", "subject": "garden",
         "user": "allotment tomatoes watering", "assistant": "water the allotment tomatoes"},
        {"session": "s2", "at": "2025-01-03T10:00:00+00:00", "subject": "misc:capital",
         "user": "capital of bhutan", "assistant": "thimphu"},
        {"session": "s3", "at": "2025-01-05T10:00:00+00:00", "subject": "misc:joke",
         "user": "a joke about penguins", "assistant": "penguins waddle jokes"},
    ]
    f = tmp_path / "h.json"
    f.write_text(json.dumps([{"name": "h", "exchanges": rows}]))
    with Memory(tmp_path / "m.db", embedder="hash") as mem:
        rep = eval_subjects([str(f)], mem)
    h = rep["histories"][0]["consolidated"]
    assert h["v_measure"] == 1.0 and h["mixed_top_level"] == 0
    assert h["v_measure_odds"] < 1.0 and h["mixed_top_level_odds"] == 0
