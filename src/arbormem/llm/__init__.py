"""The optional LLM: contract, OpenAI-compatible adapter, safe runner and roles.

Nothing here is needed for arbormem to work; an LLM improves labels, summaries,
segmentation, selection and merge vetoes, and every failure falls back to the offline path
(see ``docs/llm.md``). Importing this package does not import ``openai``.
"""

from __future__ import annotations

from .base import LLM, ChatMessage
from .openai import LLMReplyError, OpenAICompatibleLLM
from .prompts import TopicCard, Turn
from .runner import LLMCall, LLMRunner
from .validate import InvalidOutput, parse_reply

__all__ = [
    "LLM",
    "ChatMessage",
    "OpenAICompatibleLLM",
    "LLMReplyError",
    "LLMRunner",
    "LLMCall",
    "Turn",
    "TopicCard",
    "InvalidOutput",
    "parse_reply",
    "make_runner",
]


def make_runner(llm: LLM | LLMRunner | None, settings: object | None = None) -> LLMRunner | None:
    """The runner a ``Memory`` uses: from an LLM or runner argument, else from settings
    (``ARBORMEM_LLM__BASE_URL`` and ``__MODEL``), else None (offline)."""
    if isinstance(llm, LLMRunner):
        return llm
    if isinstance(llm, LLM):
        from .runner import breaker_options

        return LLMRunner(llm, **(breaker_options(settings) if settings is not None else {}))
    if llm is not None:
        from ..errors import ConfigError

        raise ConfigError(f"llm must be an arbormem LLM or LLMRunner, not {type(llm).__name__}")
    if settings is not None and getattr(settings, "base_url", None) and getattr(settings, "model", None):
        return LLMRunner.from_settings(settings)
    return None
