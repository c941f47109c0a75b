"""The LLM contract: one method that turns chat messages into the model's reply text.

arbormem never needs streaming, tools or images from a model: every role sends a short
system + user prompt and reads back one JSON object. So the contract is as small as httpx's
``BaseTransport``: implement ``chat`` and set ``name``. Any failure (network, HTTP status,
timeout, refusal, empty reply) is raised as ``LLMError``; the ``LLMRunner`` turns it into a
recorded fallback, so implementations never need to guess a "safe" answer themselves.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

ChatRole = Literal["system", "user", "assistant"]


@dataclass(frozen=True)
class ChatMessage:
    """One message of a chat request."""

    role: ChatRole
    content: str

    def to_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


class LLM(ABC):
    """A chat model. Implement ``chat``; raise ``LLMError`` on any failure."""

    #: Identifies the endpoint and default model in logs (never contains a secret).
    name: str = "llm"
    #: Seconds a call may take when the caller gives no ``timeout`` (None: no bound known).
    #: The runner bounds a call by the smaller of this (or the role's own timeout) and its
    #: caller's deadline, so a long run budget never stretches one call past it.
    timeout: float | None = None

    @abstractmethod
    def chat(
        self,
        messages: Sequence[ChatMessage],
        *,
        model: str | None = None,
        max_tokens: int = 512,
        temperature: float = 0.0,
        json_mode: bool = False,
        timeout: float | None = None,
    ) -> str:
        """Return the assistant's reply text.

        ``model`` overrides the default model for this call (per-role models); ``json_mode``
        asks the server for a JSON object when it supports that (the reply is validated
        either way); ``timeout`` (seconds) bounds this whole call, retries included, instead
        of the default per-request timeout.
        """


__all__ = ["LLM", "ChatMessage", "ChatRole"]
