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
from collections.abc import Sequence
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




# -- text a model wrote about a topic: junk that a schema cannot see --------------------------
# A title of the right type can still be junk (issue 23, seen from a real small model and a
# fixed-reply endpoint): the prompt's topic handle ("T1"), its data marker ("<<<DATA"), a
# fragment of the JSON around it ('{"id": 1, "title": "Biscuit"'), a phrase of the prompt
# ("2 to 8 words naming the specific subject"), a generic word ("chat"), or a number or date
# the topic never mentions ("June 23rd" where the text says June 14th; the timestamp of the
# prompt's turn header). ``Grounding`` holds what a text may draw on: the topic's own words and
# numbers, and the prompt's own wording, which a text must not echo.
_WORD = re.compile(r"\w+", re.UNICODE)
_HANDLE = re.compile(r"(?<!\w)T\d+(?!\w)", re.IGNORECASE)
_MARKER = re.compile(r"<<<|>>>|\bDATA>>|<<DATA\b|^==|\s==\s", re.IGNORECASE)
_JSON_KEY = re.compile(r'"[^"\s]{1,40}"\s*:')
_JSON_CHARS = "{}[]"
_TAG = re.compile(r"</?[A-Za-z][\w-]*(?:\s[^<>]*)?/?>|```|\\[nt\"]")
# Digits, with thousands separators inside a number dropped ("1,200" and "1200" agree).
_THOUSANDS = re.compile(r"(?<=\d)[,.\u00a0\u202f' ](?=\d{3}(?!\d))")
_NUMBER = re.compile(r"\d+")
# English month names are checked too: they only reject (a month the text does not name), so
# other languages simply get the number check.
_MONTHS = frozenset(
    "january february march april may june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec".split()
)
#: Titles that name no subject. Mostly the prompt's own words (caught by the echo rule as
#: well) and what a transcript is made of; a title must say what the topic is about.
GENERIC_TITLES = frozenset(
    "chat chats conversation conversations question questions topic topics discussion "
    "discussions talk talks general misc miscellaneous other others various untitled unknown "
    "help info information notes note summary title subject user assistant message messages "
    "exchange exchanges memory transcript data text stuff things".split()
)


#: Longer titles (words as separated by spaces) are sentences: the prompts ask for 2 to 8.
MAX_TITLE_WORDS = 9


def _numbers(text: str) -> set[int]:
    return {int(n) for n in _NUMBER.findall(_THOUSANDS.sub("", text))}


def _words(text: str) -> list[str]:
    return [w.casefold() for w in _WORD.findall(text)]


def _ngrams(words: Sequence[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


class Grounding:
    """What a model's text about some exchanges may and may not contain.

    ``source`` is the exchanges' own text (what the text is about); ``prompt`` is the wording
    of the prompt around it (instructions, handles, markers — never the transcript).
    """

    def __init__(self, source: str, prompt: str = "") -> None:
        self.source = source
        self._source_words = _words(source)
        self._source_set = set(self._source_words)
        self._source_numbers = _numbers(source)
        self._prompt_words = _words(prompt)
        self._source_grams: dict[int, set[tuple[str, ...]]] = {}
        self._prompt_grams: dict[int, set[tuple[str, ...]]] = {}
        self._prompt_text = " ".join(self._prompt_words)
        self._source_text = " ".join(self._source_words)

    def _grams(self, which: str, n: int) -> set[tuple[str, ...]]:
        cache = self._source_grams if which == "source" else self._prompt_grams
        if n not in cache:
            cache[n] = _ngrams(self._source_words if which == "source" else self._prompt_words, n)
        return cache[n]

    def junk(self, text: str, kind: str) -> str | None:
        """Why ``text`` (a ``title``, ``term`` or ``sentence``) is junk, or None if it is not."""
        if _HANDLE.search(text) and not _HANDLE.search(self.source):
            return f"names a prompt handle: {text[:60]!r}"
        if _MARKER.search(text) and not _MARKER.search(self.source):
            return f"holds a prompt marker: {text[:60]!r}"
        if _JSON_KEY.search(text) and not _JSON_KEY.search(self.source):
            return f"holds a JSON fragment: {text[:60]!r}"
        if any(c in text and c not in self.source for c in _JSON_CHARS):
            return f"holds JSON brackets: {text[:60]!r}"
        if _TAG.search(text) and not _TAG.search(self.source):
            return f"holds markup: {text[:60]!r}"
        absent = sorted(_numbers(text) - self._source_numbers)
        if absent:
            return f"states numbers the exchanges do not: {', '.join(map(str, absent[:5]))} in {text[:60]!r}"
        words = _words(text)
        months = [w for w in words if w in _MONTHS and w not in self._source_set]
        if months:
            return f"names a month the exchanges do not: {months[0]!r} in {text[:60]!r}"
        if not words:
            return f"has no words: {text[:60]!r}"
        if kind == "title" and len(words) == 1 and words[0] in GENERIC_TITLES and words[0] not in self._source_set:
            return f"is a generic title: {text!r}"
        if kind == "title" and len(text.split()) > MAX_TITLE_WORDS:
            # SmolLM2 copied whole user messages as titles; the prompt asks for 2 to 8 words.
            return f"is a sentence, not a title ({len(text.split())} words): {text[:60]!r}"
        # Echo: a run of words from the prompt's own wording that the exchanges do not hold.
        # A short text (a title, a term) is an echo when the whole of it is; longer ones when
        # any run of ``n`` words is (3 for titles and terms, 5 for sentences, so phrases such
        # as "when the user" that any sentence may use stay allowed).
        n = 5 if kind == "sentence" else 3
        spans = [tuple(words)] if len(words) < n else list(_ngrams(words, n))
        for gram in spans:
            if self._in_prompt(gram) and not self._in_source(gram):
                return f"echoes the prompt: {' '.join(gram)!r}"
        return None

    def _in_prompt(self, gram: tuple[str, ...]) -> bool:
        return gram in self._grams("prompt", len(gram))

    def _in_source(self, gram: tuple[str, ...]) -> bool:
        return gram in self._grams("source", len(gram))


def prompt_wording(messages: Sequence[Any]) -> str:
    """A prompt's text without the transcript between its ``<<<DATA`` and ``DATA>>>``
    markers (the markers themselves stay: they are prompt wording)."""
    parts = []
    for m in messages:
        content = getattr(m, "content", "")
        parts.append(re.sub(r"<<<DATA\n.*?\nDATA>>>", "<<<DATA DATA>>>", content, flags=re.DOTALL))
    return "\n".join(parts)


__all__ = ["InvalidOutput", "parse_reply", "extract_json_objects", "strip_reasoning", "Grounding",
           "prompt_wording", "GENERIC_TITLES"]
