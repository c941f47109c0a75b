"""arbormem: long-term memory for LLM chat apps and agents, organised as a tree of topics.

    from arbormem import Memory
    mem = Memory("memory.db")
    x = mem.begin("I'm allergic to peanuts", user_id="u1")
    mem.complete(x.id, "Noted — I'll keep that in mind.")
    print(mem.recall("what should I avoid at the party?", user_id="u1", max_tokens=512).text)
"""

from __future__ import annotations

from .aio import AsyncMemory
from .config import Settings
from .embed import CallableEmbedder, Embedder
from .errors import (
    ArbormemError,
    ConfigError,
    ConfirmationRequired,
    EmbeddingError,
    ImportFormatError,
    LLMError,
    MigrationError,
    NotFoundError,
    StateError,
    StoreError,
    ValidationError,
)
from .memory import Memory
from .models import (
    Exchange,
    ForgetReport,
    Hit,
    ImportReport,
    Recall,
    RecallTrace,
    SkippedItem,
    Stats,
    Topic,
)

__version__ = "0.1.0"

__all__ = [
    "Memory",
    "AsyncMemory",
    "Settings",
    "Embedder",
    "CallableEmbedder",
    "Exchange",
    "Topic",
    "Hit",
    "Recall",
    "RecallTrace",
    "Stats",
    "ForgetReport",
    "ImportReport",
    "SkippedItem",
    "ArbormemError",
    "ValidationError",
    "ImportFormatError",
    "NotFoundError",
    "StateError",
    "ConfirmationRequired",
    "StoreError",
    "MigrationError",
    "EmbeddingError",
    "LLMError",
    "ConfigError",
]
