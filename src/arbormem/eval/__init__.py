"""Evaluation and benchmarks: the LoCoMo loader, flat baselines, the eval runner, ``bench``.

Nothing heavy is imported here; the CLI commands live in ``arbormem.eval.cli``.
"""

from .baselines import BM25, FlatIndex, rrf
from .bench import BenchConfig, BenchReport, BenchResult, run_bench
from .locomo import Conversation, Question, Turn, Unit, load_conversations
from .runner import LocomoReport, QuestionResult, Score, run_locomo

__all__ = [
    "BM25",
    "FlatIndex",
    "rrf",
    "BenchConfig",
    "BenchReport",
    "BenchResult",
    "run_bench",
    "Conversation",
    "Question",
    "Turn",
    "Unit",
    "load_conversations",
    "LocomoReport",
    "QuestionResult",
    "Score",
    "run_locomo",
]
