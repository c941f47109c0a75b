"""Turning a model's reply into a validated pydantic object, or a clear rejection.

Models wrap JSON in code fences, put prose around it, think aloud in ``<think>`` blocks,
leave a trailing comma or forget the last closing brace. ``parse_reply`` accepts all of that,
and repairs only what has exactly one reading:

- a trailing comma before ``}`` or ``]`` is dropped;
- missing closing brackets are appended only when the text stops right after a complete
  value (never inside a string, after a key, a colon or a comma), so nothing is invented.

Everything else — prose without JSON, two different answers, a wrong schema, single quotes,
comments — is rejected with ``InvalidOutput`` and never reaches the store.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from ..errors import LLMError

M = TypeVar("M", bound=BaseModel)

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\r?\n(.*?)(?:```|\Z)", re.DOTALL)
_THINK = re.compile(r"<(think|thinking|reasoning)>.*?</\1>", re.DOTALL | re.IGNORECASE)
_OPEN_THINK = re.compile(r"<(think|thinking|reasoning)>", re.IGNORECASE)
# A value that cannot have been cut: a closed string, a closed bracket, true/false/null. A
# number can (``12`` may be the start of ``120``), so a reply ending in a digit is rejected.
_VALUE_END = frozenset('"}]el')


class InvalidOutput(LLMError):
    """The model answered, but not with a usable object of the expected schema."""


def strip_reasoning(text: str) -> str:
    """Remove ``<think>...</think>`` blocks; reject a reply that never closed one."""
    text = _THINK.sub("", text)
    if _OPEN_THINK.search(text):
        raise InvalidOutput("the reply is an unfinished <think> block")
    return text


def _scan(text: str, start: int) -> tuple[int | None, list[str], bool]:
    """Scan a JSON value from ``text[start]`` (``{`` or ``[``), string- and escape-aware.

    Returns (end index of the matching close or None, the stack of unclosed openers,
    whether the scan ended inside a string).
    """
    stack: list[str] = []
    in_str = False
    esc = False
    for i in range(start, len(text)):
        c = text[i]
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
            continue
        if c == '"':
            in_str = True
        elif c in "{[":
            stack.append(c)
        elif c in "}]":
            if not stack or (stack[-1] == "{") != (c == "}"):
                return None, stack, False  # mismatched bracket: not JSON
            stack.pop()
            if not stack:
                return i, [], False
    return None, stack, in_str


def _drop_trailing_commas(text: str) -> str:
    """Remove commas directly before a closing bracket, outside strings."""
    out: list[str] = []
    in_str = esc = False
    for c in text:
        if in_str:
            out.append(c)
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
            continue
        if c == '"':
            in_str = True
        elif c in "}]":
            j = len(out) - 1
            while j >= 0 and out[j].isspace():
                j -= 1
            if j >= 0 and out[j] == ",":
                del out[j]
        out.append(c)
    return "".join(out)


def _loads(text: str) -> Any:
    # Python's json accepts NaN/Infinity; a model's JSON must not carry them into the store.
    def reject(name: str) -> Any:
        raise ValueError(f"non-standard number {name}")

    return json.loads(text, parse_constant=reject)


def _candidates(text: str) -> list[tuple[str, bool]]:
    """JSON object texts found in ``text``, each with a flag: True when it was repaired."""
    found: list[tuple[str, bool]] = []
    i = 0
    while True:
        start = text.find("{", i)
        if start < 0:
            break
        end, stack, in_str = _scan(text, start)
        if end is not None:
            found.append((text[start : end + 1], False))
            i = end + 1
            continue
        # Unclosed: repair only when the text stops right after a complete value (a model
        # that forgot its last braces; replies cut at max_tokens never get here, the adapter
        # rejects them).
        tail = _drop_trailing_commas(text[start:]).rstrip()
        if stack and not in_str and tail and tail[-1] in _VALUE_END:
            closers = "".join("}" if o == "{" else "]" for o in reversed(stack))
            found.append((tail + closers, True))
        break
    return found


def extract_json_objects(reply: str) -> list[dict[str, Any]]:
    """Every distinct JSON object the reply offers, after the safe repairs, in order."""
    text = strip_reasoning(reply).strip().lstrip("\ufeff")
    blocks = [body for _, body in _FENCE.findall(text)]
    sources = blocks + [text] if blocks else [text]
    objects: list[dict[str, Any]] = []
    for source in sources:
        source = source.strip()
        try:
            value = _loads(source)
            if isinstance(value, dict):
                objects.append(value)
                continue
        except ValueError:
            pass
        for candidate, _repaired in _candidates(source):
            for attempt in (candidate, _drop_trailing_commas(candidate)):
                try:
                    value = _loads(attempt)
                except ValueError:
                    continue
                if isinstance(value, dict):
                    objects.append(value)
                break
    distinct: list[dict[str, Any]] = []
    for obj in objects:
        if obj not in distinct:
            distinct.append(obj)
    return distinct


def parse_reply(reply: str, schema: type[M]) -> M:
    """Validate a model reply against ``schema``; raise InvalidOutput if it cannot be used.

    When the reply holds several JSON objects, exactly one distinct object may validate —
    a model that shows an example and then its answer is ambiguous, so it is rejected.
    """
    if not reply or not reply.strip():
        raise InvalidOutput("the reply is empty")
    objects = extract_json_objects(reply)
    if not objects:
        raise InvalidOutput("the reply contains no JSON object")
    valid: list[M] = []
    errors: list[str] = []
    for obj in objects:
        try:
            valid.append(schema.model_validate(obj))
        except PydanticValidationError as exc:
            errors.append(_short_errors(exc))
    if len(valid) == 1:
        return valid[0]
    if len(valid) > 1:
        raise InvalidOutput(f"the reply holds {len(valid)} different valid answers")
    raise InvalidOutput(f"the reply does not match {schema.__name__}: {errors[0]}")


def _short_errors(exc: PydanticValidationError) -> str:
    parts = []
    for err in exc.errors()[:4]:
        loc = ".".join(str(x) for x in err.get("loc", ()))
        parts.append(f"{loc or '<root>'}: {err.get('msg', 'invalid')}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


__all__ = ["InvalidOutput", "parse_reply", "extract_json_objects", "strip_reasoning"]
