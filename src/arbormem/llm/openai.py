"""An ``LLM`` for any OpenAI-compatible ``/v1/chat/completions`` endpoint.

Works with OpenAI, LM Studio, Ollama, vLLM, llama.cpp's server and NVIDIA NIM through the
official ``openai`` SDK (``pip install 'arbormem[llm]'``), imported lazily so arbormem imports
without it.

Retries are done here rather than by the SDK (which is given ``max_retries=0``) so the policy
is explicit and the same for chat and embeddings: transient failures (connection errors,
408/409/429/5xx) are retried at most ``max_retries`` times with exponential backoff and
jitter, honouring a short ``Retry-After``; everything else fails at once. A chat request that
timed out is not retried (``LLMTimeout``): at temperature 0 the same prompt asks for the same
long generation, which times out again, and a local server keeps generating for the request
it was abandoned by, so a retry only queues behind it (issue 23: 3 x 30 s per labeler call). A semaphore
bounds how many requests this client has in flight, so a background organiser can never
flood a small local server.

The API key is handed to the SDK and nowhere else: ``name``, ``repr`` and every error
message are built without it (and scrubbed of it, in case a server echoes it back).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ..errors import ConfigError, LLMError
from .base import LLM, ChatMessage

T = TypeVar("T")

_INSTALL_HINT = "the OpenAI-compatible client needs the openai package: pip install 'arbormem[llm]'"
_RETRY_STATUS = frozenset({408, 409, 429})


class LLMTimeout(LLMError):
    """The request got no answer within its timeout (not retried by the chat adapter)."""


class LLMReplyError(LLMError):
    """The endpoint answered, but the answer is unusable (refusal, empty, cut at max_tokens).

    ``raw`` keeps what the model did say, for the runner's log.
    """

    def __init__(self, message: str, raw: str = "") -> None:
        super().__init__(message)
        self.raw = raw


def import_openai() -> Any:
    """Import the ``openai`` SDK or raise ConfigError with the install hint."""
    try:
        import openai
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ConfigError(_INSTALL_HINT) from exc
    return openai


def safe_endpoint(base_url: str) -> str:
    """``host[:port]/path`` of a URL without user info or query (which may hold secrets)."""
    parts = urlsplit(base_url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return f"{host}{parts.path}".rstrip("/") or base_url.split("?", 1)[0]


class OpenAIEndpoint:
    """The shared transport of the chat and embedding adapters: client, retries, semaphore."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 2,
        concurrency: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        retry_timeouts: bool = True,
    ) -> None:
        if not base_url:
            raise ConfigError("an OpenAI-compatible endpoint needs a base_url")
        if timeout <= 0 or max_retries < 0 or concurrency < 1:
            raise ConfigError("timeout must be > 0, max_retries >= 0 and concurrency >= 1")
        self.base_url = base_url
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        self.retry_timeouts = retry_timeouts
        # Local servers (LM Studio, Ollama, vLLM) accept any key, but the SDK insists on one.
        self._api_key = api_key or "not-needed"
        self._secret = api_key or ""
        self._slots = threading.BoundedSemaphore(concurrency)
        self._client: Any = None
        self._client_lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The SDK client, created on first use (no work at construction or import)."""
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    openai = import_openai()
                    self._client = openai.OpenAI(
                        base_url=self.base_url,
                        api_key=self._api_key,
                        timeout=self.timeout,
                        max_retries=0,
                    )
        return self._client

    def scrub(self, text: str) -> str:
        """Remove the API key from a message (servers sometimes echo request headers)."""
        if self._secret and self._secret in text:
            text = text.replace(self._secret, "***")
        return text

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def call(self, what: str, fn: Callable[[], T], deadline: float | None = None) -> T:
        """Run one SDK request with the retry policy; raise LLMError when it cannot succeed.
        No retry starts (and no backoff waits) past ``deadline`` (``time.monotonic()``)."""
        openai = import_openai()
        attempt = 0
        while True:
            failure: Exception
            try:
                with self._slots:
                    return fn()
            except openai.APIStatusError as exc:
                status = int(exc.status_code)
                retryable = status in _RETRY_STATUS or status >= 500
                error = self._describe(what, exc, status)
                wait = self._retry_after(exc)
                failure = exc
            except openai.APIConnectionError as exc:  # includes APITimeoutError
                timed_out = isinstance(exc, openai.APITimeoutError)
                error = self._describe(what, exc, None)
                if timed_out and not self.retry_timeouts:
                    raise LLMTimeout(error) from exc
                retryable = True
                wait = None
                failure = exc
            except Exception as exc:  # SDK validation errors, odd bodies: all are LLM failures
                raise LLMError(self._describe(what, exc, None)) from exc
            if not retryable or attempt >= self.max_retries:
                if isinstance(failure, openai.APITimeoutError):
                    raise LLMTimeout(error) from failure
                raise LLMError(error) from failure
            delay = self.backoff * (2**attempt) * (0.5 + random.random() / 2)
            if wait is not None:
                delay = max(delay, wait)
            if deadline is not None and time.monotonic() + min(delay, self.max_backoff) >= deadline:
                raise LLMError(f"{error} (no time left to retry)") from failure
            time.sleep(min(delay, self.max_backoff))
            attempt += 1

    def _describe(self, what: str, exc: Exception, status: int | None) -> str:
        kind = type(exc).__name__
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        head = f"{what}: {kind}" + (f" (HTTP {status})" if status is not None else "")
        return self.scrub(f"{head}: {detail[:300]}" if detail else head)

    @staticmethod
    def _retry_after(exc: Any) -> float | None:
        try:
            value = exc.response.headers.get("retry-after")
            return float(value) if value is not None else None
        except (AttributeError, TypeError, ValueError):
            return None


class OpenAICompatibleLLM(LLM):
    """Chat over any OpenAI-compatible server.

    >>> llm = OpenAICompatibleLLM("http://localhost:1234/v1", model="qwen2.5-7b-instruct")

    ``json_mode`` sends ``response_format={"type": "json_object"}``; servers that reject it
    (LM Studio accepts only ``json_schema``) get the request again without it, and the
    adapter stops asking — the runner validates the text either way. In the same way a 400
    about ``max_tokens`` (OpenAI reasoning models) switches to ``max_completion_tokens`` and
    one about ``temperature`` stops sending it.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 2,
        concurrency: int = 4,
        backoff: float = 0.5,
    ) -> None:
        if not model:
            raise ConfigError("an OpenAI-compatible LLM needs a model name")
        self.model = model
        self.endpoint = OpenAIEndpoint(
            base_url,
            api_key=api_key,
            timeout=timeout,
            max_retries=max_retries,
            concurrency=concurrency,
            backoff=backoff,
            retry_timeouts=False,
        )
        self.name = f"openai-compatible:{model}@{safe_endpoint(base_url)}"
        self.timeout = float(timeout)
        self._json_supported = True
        self._send_temperature = True
        self._tokens_param = "max_tokens"

    @classmethod
    def from_settings(cls, settings: Any) -> OpenAICompatibleLLM:
        """Build from ``config.LLMSettings`` (base_url and model must be set)."""
        if not settings.base_url or not settings.model:
            raise ConfigError("LLM settings need both base_url and model")
        key = settings.api_key.get_secret_value() if settings.api_key is not None else None
        return cls(
            settings.base_url,
            settings.model,
            api_key=key,
            timeout=settings.timeout,
            max_retries=settings.max_retries,
            concurrency=settings.concurrency,
        )

    def __repr__(self) -> str:
        return f"OpenAICompatibleLLM({self.name!r})"

    def close(self) -> None:
        self.endpoint.close()

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
        openai = import_openai()
        payload: dict[str, Any] = {
            "model": model or self.model,
            "messages": [m.to_dict() for m in messages],
            self._tokens_param: max_tokens,
        }
        if self._send_temperature:
            payload["temperature"] = temperature
        if json_mode and self._json_supported:
            payload["response_format"] = {"type": "json_object"}
        # A per-call timeout is the whole call's budget, retries included: a caller that gives
        # one (the recall planner, bounded by the recall's deadline) is not waiting after it,
        # so a retry past it would only load the server.
        deadline = None if timeout is None else time.monotonic() + timeout

        def create() -> Any:
            options = dict(payload)
            if deadline is not None:
                options["timeout"] = max(0.001, deadline - time.monotonic())
            return self.endpoint.client.chat.completions.create(**options)

        # Servers differ in what they accept; a 400 about one optional parameter is answered
        # by adapting the request (once per parameter) and remembering it for later calls.
        for _ in range(4):
            try:
                resp = self.endpoint.call("chat", create, deadline=deadline)
                return self._reply_text(resp)
            except LLMError as exc:
                if not isinstance(exc.__cause__, openai.BadRequestError | openai.UnprocessableEntityError):
                    raise
                if not self._adapt(payload, str(exc.__cause__).lower()):
                    raise
        raise LLMError("chat: the server rejected every variant of the request")

    def _adapt(self, payload: dict[str, Any], message: str) -> bool:
        """Change the request after a 400 that names an unsupported parameter."""
        if "max_tokens" in message and "max_tokens" in payload:
            # OpenAI's reasoning models want max_completion_tokens instead.
            self._tokens_param = "max_completion_tokens"
            payload["max_completion_tokens"] = payload.pop("max_tokens")
            return True
        if "temperature" in message and "temperature" in payload:
            self._send_temperature = False  # models that only run at their default
            del payload["temperature"]
            return True
        if "response_format" in payload:
            # LM Studio and others do not do json_object; the prompts ask for JSON anyway.
            self._json_supported = False
            del payload["response_format"]
            return True
        return False

    @staticmethod
    def _reply_text(resp: Any) -> str:
        choices = getattr(resp, "choices", None) or []
        if not choices:
            raise LLMReplyError("chat: the reply has no choices")
        choice = choices[0]
        message = choice.message
        content = (message.content or "") if message is not None else ""
        refusal = getattr(message, "refusal", None) if message is not None else None
        if refusal:
            raise LLMReplyError(f"chat: the model refused: {str(refusal)[:200]}", raw=str(refusal))
        if choice.finish_reason == "content_filter":
            raise LLMReplyError("chat: the reply was blocked by a content filter", raw=content)
        if choice.finish_reason == "length":
            # Cut output is never repaired into data: whatever was cut may have mattered.
            raise LLMReplyError("chat: the reply was cut at max_tokens", raw=content)
        if not content.strip():
            raise LLMReplyError("chat: the reply is empty")
        return content


__all__ = ["OpenAICompatibleLLM", "OpenAIEndpoint", "LLMReplyError", "LLMTimeout", "safe_endpoint"]
