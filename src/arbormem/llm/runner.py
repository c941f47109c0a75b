"""``LLMRunner``: the one door through which arbormem calls a model.

Every role goes through ``LLMRunner.run``, which guarantees the property the seeds lacked:
**a role returns a validated, typed result or None — never an exception, never error text.**
Any failure (network, HTTP status, timeout, refusal, empty or cut reply, unparseable JSON,
wrong schema, a failed semantic check) becomes None, and the caller takes its offline path.

Each call is recorded in a bounded in-memory log (role, model, input size, raw output, error,
duration), so a failure is visible (``Memory.llm_log()``) instead of silent, and the log
cannot grow without bound. The runner also counts calls per role and lets each role use its
own model (a small fast one for the per-recall planner, a larger one for summaries).
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar, overload

from pydantic import BaseModel

from .base import LLM, ChatMessage
from .openai import LLMReplyError
from .validate import InvalidOutput, parse_reply

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")

#: Roles and the default number of output tokens each may use. Sized so a well-behaved
#: answer always fits: a reply cut at max_tokens is rejected, never repaired.
ROLE_MAX_TOKENS: dict[str, int] = {
    "router": 200,
    "labeler": 500,
    "detail": 700,
    "segmenter": 1200,
    "planner": 350,
    "veto": 150,
}


@dataclass(frozen=True)
class LLMCall:
    """One recorded role call. ``error`` is None when the call produced a valid result."""

    role: str
    model: str | None
    at: datetime
    input_chars: int
    output: str
    error: str | None
    duration_ms: float

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "model": self.model,
            "at": self.at.isoformat(),
            "input_chars": self.input_chars,
            "output": self.output,
            "error": self.error,
            "duration_ms": round(self.duration_ms, 1),
            "ok": self.ok,
        }


class LLMRunner:
    """Runs LLM roles safely: typed result or None, with a bounded log and call counts.

    ``models`` maps a role name to a model that overrides the LLM's default for that role;
    ``timeouts`` does the same for the per-request timeout (seconds) — useful to keep the
    recall planner, which a user waits for, much shorter than background summaries.
    ``max_tokens`` raises a role's output budget (reasoning models spend tokens thinking
    before they answer, and a reply cut at the budget is rejected).
    After ``breaker_failures`` endpoint failures in a row (errors, timeouts, missed deadlines;
    not invalid answers) calls are skipped — and logged as skipped — for ``breaker_cooldown``
    seconds; then one probe call goes through (the others keep being skipped while it runs),
    and its outcome closes or reopens the breaker.

    ``run(..., deadline=...)`` bounds a call by a point in time (``time.monotonic()``): a
    caller that waits (recall) gets None when it passes, whatever the LLM does meanwhile.
    """

    def __init__(
        self,
        llm: LLM,
        *,
        models: Mapping[str, str] | None = None,
        timeouts: Mapping[str, float] | None = None,
        max_tokens: Mapping[str, int] | None = None,
        log_size: int = 200,
        max_output_chars: int = 4000,
        breaker_failures: int = 3,
        breaker_cooldown: float = 30.0,
    ) -> None:
        self.llm = llm
        self.models = dict(models or {})
        self.timeouts = dict(timeouts or {})
        self.max_tokens = {**ROLE_MAX_TOKENS, **(max_tokens or {})}
        self.max_output_chars = max_output_chars
        self._log: deque[LLMCall] = deque(maxlen=log_size)
        self._calls: Counter[str] = Counter()
        self._failures: Counter[str] = Counter()
        self._lock = threading.Lock()
        # Circuit breaker: after ``breaker_failures`` endpoint failures in a row (not bad
        # answers: those prove the server is up), calls are skipped for ``breaker_cooldown``
        # seconds, so a dead server costs one timeout, not one per recall.
        self.breaker_failures = breaker_failures
        self.breaker_cooldown = breaker_cooldown
        self._down_streak = 0
        self._open_until = 0.0
        self._probing = False  # a half-open breaker lets one call through at a time

    @classmethod
    def from_settings(cls, settings: Any) -> LLMRunner:
        """A runner over ``OpenAICompatibleLLM`` built from ``config.LLMSettings``."""
        from .openai import OpenAICompatibleLLM

        models = getattr(settings, "models", None) or {}
        return cls(OpenAICompatibleLLM.from_settings(settings), models=models, **breaker_options(settings))

    @property
    def name(self) -> str:
        return self.llm.name

    # -- the one entry point -------------------------------------------------------------------
    @overload
    def run(
        self, role: str, messages: Sequence[ChatMessage], schema: type[M], *,
        max_tokens: int | None = None, check: None = None, deadline: float | None = None,
    ) -> M | None: ...

    @overload
    def run(
        self, role: str, messages: Sequence[ChatMessage], schema: type[M], *,
        max_tokens: int | None = None, check: Callable[[M], R], deadline: float | None = None,
    ) -> R | None: ...

    def run(
        self,
        role: str,
        messages: Sequence[ChatMessage],
        schema: type[M],
        *,
        max_tokens: int | None = None,
        check: Callable[[M], Any] | None = None,
        deadline: float | None = None,
    ) -> Any:
        """Call the model for ``role``; return the validated object, or None on any failure.

        ``check`` runs after schema validation for rules a schema cannot express (ids that
        must exist in the input, spans that must cover it); it returns the final result (a
        cleaned copy, or another type) and raises (anything) to reject. ``deadline`` (a
        ``time.monotonic()`` value) is when the caller stops waiting: the call then counts as
        a failed one (and toward the breaker) and its late answer is dropped.
        """
        model = self.models.get(role)
        input_chars = sum(len(m.content) for m in messages)
        skipped = self._admit(deadline)
        if skipped is not None:
            with self._lock:
                self._log.append(LLMCall(
                    role=role, model=model or getattr(self.llm, "model", None), at=datetime.now(timezone.utc),
                    input_chars=input_chars, output="", duration_ms=0.0, error=f"skipped: {skipped}",
                ))
            return None
        raw = ""
        error: str | None = None
        result: Any = None
        started = time.perf_counter()
        try:
            timeout = self.timeouts.get(role)
            if deadline is not None:
                left = max(0.001, deadline - time.monotonic())
                timeout = left if timeout is None else min(timeout, left)
            reply: object = self._chat(deadline, lambda: self.llm.chat(
                messages,
                model=model,
                max_tokens=max(max_tokens or 0, self.max_tokens.get(role, 400)),
                temperature=0.0,
                json_mode=True,
                timeout=timeout,
            ))
            if not isinstance(reply, str):
                raw = repr(reply)
                raise InvalidOutput(f"the LLM returned {type(reply).__name__}, not text")
            raw = reply
            parsed = parse_reply(raw, schema)
            result = check(parsed) if check is not None else parsed
        except BaseException as exc:
            if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: not the LLM's
                with self._lock:
                    self._probing = False
                raise
            # the whole point: nothing escapes into the caller
            error = _describe(exc)
            raw = raw or str(getattr(exc, "raw", "") or "")
            result = None
            self._endpoint_state(up=isinstance(exc, InvalidOutput | LLMReplyError))
        else:
            self._endpoint_state(up=True)
        duration = (time.perf_counter() - started) * 1000.0
        self._record(LLMCall(
            role=role,
            model=model or getattr(self.llm, "model", None),
            at=datetime.now(timezone.utc),
            input_chars=input_chars,
            output=raw[: self.max_output_chars],
            error=error,
            duration_ms=duration,
        ))
        return result

    def _admit(self, deadline: float | None) -> str | None:
        """None when a call may go out now, else why it is skipped."""
        now = time.monotonic()
        if deadline is not None and deadline <= now:
            return "the caller's deadline has passed"
        with self._lock:
            if self.breaker_failures <= 0 or self._down_streak < self.breaker_failures:
                return None
            if self._open_until > now:
                return (f"the endpoint failed {self._down_streak} times in a row; "
                        f"next attempt in {self._open_until - now:.0f}s")
            if self._probing:
                return "the endpoint failed; another call is probing whether it is back"
            self._probing = True  # half-open: this call is the probe
            return None

    @staticmethod
    def _chat(deadline: float | None, call: Callable[[], object]) -> object:
        """``call()``, or DeadlineExceeded once ``deadline`` passes. The call then runs on in
        its (daemon) thread until the LLM's own timeout ends it, and its answer is dropped:
        an LLM that ignores ``timeout`` cannot hold the caller."""
        if deadline is None:
            return call()
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["reply"] = call()
            except BaseException as exc:  # handed to the caller's thread
                box["error"] = exc

        worker = threading.Thread(target=target, name="arbormem-llm-call", daemon=True)
        worker.start()
        worker.join(max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            raise DeadlineExceeded("no answer before the caller's deadline")
        if "error" in box:
            raise box["error"]
        return box.get("reply")

    def _endpoint_state(self, *, up: bool) -> None:
        with self._lock:
            self._probing = False
            if up:
                self._down_streak = 0
                self._open_until = 0.0
                return
            self._down_streak += 1
            if self.breaker_failures > 0 and self._down_streak >= self.breaker_failures:
                self._open_until = time.monotonic() + self.breaker_cooldown

    # -- inspection ----------------------------------------------------------------------------
    def _record(self, call: LLMCall) -> None:
        with self._lock:
            self._log.append(call)
            self._calls[call.role] += 1
            if call.error is not None:
                self._failures[call.role] += 1

    def log(self, *, failures_only: bool = False, role: str | None = None) -> list[LLMCall]:
        """The recorded calls, oldest first (bounded to the last ``log_size``)."""
        with self._lock:
            calls = list(self._log)
        return [
            c for c in calls
            if (not failures_only or c.error is not None) and (role is None or c.role == role)
        ]

    def clear_log(self) -> None:
        """Forget the recorded calls (their raw outputs hold users' data); counts stay."""
        with self._lock:
            self._log.clear()

    def counts(self) -> dict[str, int]:
        """Calls made per role since the runner was created (not bounded like the log)."""
        with self._lock:
            return dict(self._calls)

    def failure_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._failures)

    @property
    def total_calls(self) -> int:
        with self._lock:
            return sum(self._calls.values())

    def close(self) -> None:
        closer = getattr(self.llm, "close", None)
        if callable(closer):
            closer()


class DeadlineExceeded(TimeoutError):
    """The caller's deadline passed before the LLM answered."""


def breaker_options(settings: Any) -> dict[str, Any]:
    """The runner's breaker arguments from ``config.LLMSettings``."""
    return {"breaker_failures": getattr(settings, "breaker_failures", 3),
            "breaker_cooldown": getattr(settings, "breaker_cooldown", 30.0)}


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:500]


__all__ = ["LLMRunner", "LLMCall", "ROLE_MAX_TOKENS", "DeadlineExceeded", "breaker_options"]
