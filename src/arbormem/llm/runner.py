"""``LLMRunner``: the one door through which arbormem calls a model.

Every role goes through ``LLMRunner.run``, which guarantees the property the seeds lacked:
**a role returns a validated, typed result or None — never an exception, never error text.**
Any failure (network, HTTP status, timeout, refusal, empty or cut reply, unparseable JSON,
wrong schema, a failed semantic check) becomes None, and the caller takes its offline path.

Each call is recorded in a bounded in-memory log (role, model, input size, raw output, error,
outcome, duration), so a failure is visible (``Memory.llm_log()``) instead of silent, and the
log cannot grow without bound. The runner counts what happened (``usage()``: calls sent, valid
answers, invalid answers, timeouts, other errors, and calls skipped by the breaker, by a passed
deadline or as a repeat of a failed prompt) and lets each role use its own model and timeout.

**A failed prompt is not sent again** while it is remembered (``failure_ttl``, 1 h): at
temperature 0 the same prompt gets the same rejected answer or the same too-long generation.
The memory is in-process, keyed by a hash of (role, model, output budget, messages): a failure
says something about this model on this prompt, not about the user's memory, so it is not
written to the store (a failed call writes nothing there, and the stored tree stays identical
to the offline one); a long-lived process (``serve``, ``mcp``, the ``Organizer``) keeps one
runner for its lifetime, and a one-shot process sends each failed prompt at most once.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, TypeVar, overload

from pydantic import BaseModel

from .base import LLM, ChatMessage
from .openai import LLMReplyError, LLMTimeout
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


#: What became of one role call: a valid result; an answer that failed validation (or was
#: refused, empty or cut); no answer in time; another endpoint failure; or not sent at all.
Outcome = Literal["ok", "invalid", "timeout", "error", "skipped"]
#: Why a call was not sent.
SkipReason = Literal["breaker", "deadline", "repeat"]


@dataclass(frozen=True)
class LLMCall:
    """One recorded role call. ``error`` is None when the call produced a valid result;
    ``outcome`` says what happened, ``skip`` why a call was not sent (then nothing was)."""

    role: str
    model: str | None
    at: datetime
    input_chars: int
    output: str
    error: str | None
    duration_ms: float
    outcome: Outcome = "ok"
    skip: SkipReason | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def sent(self) -> bool:
        return self.outcome != "skipped"

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "model": self.model,
            "at": self.at.isoformat(),
            "input_chars": self.input_chars,
            "output": self.output,
            "error": self.error,
            "outcome": self.outcome,
            "skip": self.skip,
            "duration_ms": round(self.duration_ms, 1),
            "ok": self.ok,
        }


@dataclass(frozen=True)
class LLMUsage:
    """What a runner did since it was created (not bounded like the log).

    ``calls`` were sent to the endpoint; each ended as ``ok``, ``invalid`` (an answer that
    failed validation, a refusal, an empty or cut reply), ``timeout`` (no answer within the
    call's timeout or the caller's deadline) or ``error`` (connection refused, HTTP errors).
    Skipped calls were never sent: the breaker was open, the caller's deadline had passed,
    or the same prompt had failed recently (``skipped_repeat``).
    """

    calls: int = 0
    ok: int = 0
    failures: int = 0  # invalid + timeouts + errors
    invalid: int = 0
    timeouts: int = 0
    errors: int = 0
    skipped: int = 0  # skipped_breaker + skipped_deadline + skipped_repeat
    skipped_breaker: int = 0
    skipped_deadline: int = 0
    skipped_repeat: int = 0
    by_role: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "by_role": dict(self.by_role)}

    def summary(self) -> str:
        """One line for people: ``5 calls (1 ok, 3 invalid, 1 timed out, 0 errors); ...``."""
        line = (f"{self.calls} calls ({self.ok} ok, {self.invalid} invalid, {self.timeouts} timed out, "
                f"{self.errors} errors)")
        if self.skipped:
            line += (f"; {self.skipped} skipped (breaker open {self.skipped_breaker}, deadline passed "
                     f"{self.skipped_deadline}, failed before {self.skipped_repeat})")
        return line


class _RecentFailures:
    """Prompt fingerprints that failed recently, each with why; bounded and expiring."""

    def __init__(self, ttl: float, size: int = 4096) -> None:
        self.ttl = ttl
        self.size = size
        self._items: OrderedDict[str, tuple[float, str]] = OrderedDict()

    def get(self, key: str, now: float) -> str | None:
        item = self._items.get(key)
        if item is None:
            return None
        if item[0] <= now:
            del self._items[key]
            return None
        return item[1]

    def add(self, key: str, now: float, why: str) -> None:
        if self.ttl <= 0:
            return
        self._items[key] = (now + self.ttl, why)
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def clear(self) -> None:
        self._items.clear()


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
    A prompt whose call timed out or got an invalid answer is not sent again for
    ``failure_ttl`` seconds (0: no memory); such calls are skipped and logged as repeats.

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
        failure_ttl: float = 3600.0,
    ) -> None:
        self.llm = llm
        self.models = dict(models or {})
        self.timeouts = dict(timeouts or {})
        self.max_tokens = {**ROLE_MAX_TOKENS, **(max_tokens or {})}
        self.max_output_chars = max_output_chars
        self._log: deque[LLMCall] = deque(maxlen=log_size)
        self._calls: Counter[str] = Counter()
        self._failures: Counter[str] = Counter()
        self._outcomes: Counter[str] = Counter()
        self._recent_failures = _RecentFailures(failure_ttl)
        self._lock = threading.Lock()
        self._local = threading.local()  # the last call of each thread (``last_call``)
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

        Long: one call's life in the order it happens (breaker, deadline and repeat skips;
        send; classify the outcome; validate; remember a failed prompt; count), each step
        reading and updating the same per-call record.

        ``check`` runs after schema validation for rules a schema cannot express (ids that
        must exist in the input, spans that must cover it); it returns the final result (a
        cleaned copy, or another type) and raises (anything) to reject. ``deadline`` (a
        ``time.monotonic()`` value) is when the caller stops waiting: the call then counts as
        a failed one (and toward the breaker) and its late answer is dropped.
        """
        model = self.models.get(role)
        input_chars = sum(len(m.content) for m in messages)
        budget = max(max_tokens or 0, self.max_tokens.get(role, 400))
        key = _fingerprint(role, model, budget, schema.__name__, messages)
        skipped = self._admit(deadline, key)
        if skipped is not None:
            reason, why = skipped
            self._record(LLMCall(
                role=role, model=model or getattr(self.llm, "model", None), at=datetime.now(timezone.utc),
                input_chars=input_chars, output="", duration_ms=0.0, error=f"skipped: {why}",
                outcome="skipped", skip=reason,
            ))
            return None
        raw = ""
        error: str | None = None
        outcome: Outcome = "ok"
        result: Any = None
        answered = False
        started = time.perf_counter()
        try:
            # The role's timeout, else the LLM's default: a caller's deadline (an organize run's
            # budget) only ever shortens a call, never stretches it past its own timeout.
            timeout = self.timeouts.get(role, getattr(self.llm, "timeout", None))
            if deadline is not None:
                left = max(0.001, deadline - time.monotonic())
                timeout = left if timeout is None else min(timeout, left)
            reply: object = self._chat(deadline, lambda: self.llm.chat(
                messages,
                model=model,
                max_tokens=budget,
                temperature=0.0,
                json_mode=True,
                timeout=timeout,
            ))
            answered = True
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
            # An answer that fails parsing or a check, a refusal, an empty or cut reply: the
            # server is up, the prompt is the problem. No answer in time: the prompt asks for
            # more than the budget allows (or the server is swamped). Both are remembered.
            if answered or isinstance(exc, InvalidOutput | LLMReplyError):
                outcome = "invalid"
            elif isinstance(exc, LLMTimeout | TimeoutError):
                outcome = "timeout"
            else:
                outcome = "error"
            self._endpoint_state(up=outcome == "invalid")
            if outcome != "error":
                with self._lock:
                    self._recent_failures.add(key, time.monotonic(), f"{outcome}: {error[:120]}")
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
            outcome=outcome,
        ))
        return result

    def _admit(self, deadline: float | None, key: str) -> tuple[SkipReason, str] | None:
        """None when a call may go out now, else why it is skipped."""
        now = time.monotonic()
        if deadline is not None and deadline <= now:
            return "deadline", "the caller's deadline has passed"
        with self._lock:
            # Checked before the breaker: a repeat must not take the half-open probe's slot.
            failed = self._recent_failures.get(key, now)
            if failed is not None:
                return "repeat", f"the same prompt failed recently ({failed})"
            if self.breaker_failures <= 0 or self._down_streak < self.breaker_failures:
                return None
            if self._open_until > now:
                return "breaker", (f"the endpoint failed {self._down_streak} times in a row; "
                                   f"next attempt in {self._open_until - now:.0f}s")
            if self._probing:
                return "breaker", "the endpoint failed; another call is probing whether it is back"
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
        self._local.last = call
        with self._lock:
            self._log.append(call)
            self._outcomes[call.skip or call.outcome] += 1
            if not call.sent:
                return
            self._calls[call.role] += 1
            if call.error is not None:
                self._failures[call.role] += 1

    def last_call(self) -> LLMCall | None:
        """The last call this thread made through the runner (sent or skipped): lets a caller
        that got None tell an invalid answer from a timeout or a skip, even while other
        threads use the same runner."""
        call: LLMCall | None = getattr(self._local, "last", None)
        return call

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
        """Calls sent per role since the runner was created (not bounded like the log)."""
        with self._lock:
            return dict(self._calls)

    def failure_counts(self) -> dict[str, int]:
        """Sent calls that gave no valid result, per role (skipped calls are not counted)."""
        with self._lock:
            return dict(self._failures)

    def usage(self) -> LLMUsage:
        """Calls sent and how they ended, and calls skipped and why (since creation)."""
        with self._lock:
            o = self._outcomes
            return LLMUsage(
                calls=sum(self._calls.values()), ok=o["ok"],
                failures=o["invalid"] + o["timeout"] + o["error"], invalid=o["invalid"],
                timeouts=o["timeout"], errors=o["error"],
                skipped=o["breaker"] + o["deadline"] + o["repeat"], skipped_breaker=o["breaker"],
                skipped_deadline=o["deadline"], skipped_repeat=o["repeat"], by_role=dict(self._calls),
            )

    def forget_failures(self) -> None:
        """Let every prompt that failed be sent again (e.g. after changing the model)."""
        with self._lock:
            self._recent_failures.clear()

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
    """The runner's breaker, failure-memory and per-role timeout arguments from
    ``config.LLMSettings``."""
    return {"breaker_failures": getattr(settings, "breaker_failures", 3),
            "breaker_cooldown": getattr(settings, "breaker_cooldown", 30.0),
            "failure_ttl": getattr(settings, "failure_ttl", 3600.0),
            "timeouts": dict(getattr(settings, "timeouts", None) or {})}


def _fingerprint(role: str, model: str | None, max_tokens: int, schema: str,
                 messages: Sequence[ChatMessage]) -> str:
    """The identity of a request: the same fingerprint gets the same answer at temperature 0."""
    body = json.dumps([role, model, max_tokens, schema, [m.to_dict() for m in messages]],
                      ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:500]


__all__ = ["LLMRunner", "LLMCall", "LLMUsage", "Outcome", "SkipReason", "ROLE_MAX_TOKENS", "DeadlineExceeded",
           "breaker_options"]
