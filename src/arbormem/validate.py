"""Input validation for the public API: every check runs before anything is stored.

This is the one validation layer: every door (Python, async, HTTP, MCP, CLI, integrations)
reaches the memory through ``Memory``, whose methods run these checks first. What passes here
can be stored, read back, embedded, indexed, counted and rendered by every store; what does
not raises ``ValidationError`` with a message that says which bound it broke. The bounds and
what happens past each are listed in docs/robustness.md ("Bounds").

- Strings (ids, names, texts, metadata keys and values) must be valid Unicode: a lone
  surrogate cannot be encoded as UTF-8, so no store, embedder or JSON encoder can take it.
- JSON values (metadata, message fields) hold JSON-safe numbers only: NaN and Infinity are
  not JSON (SQLite's JSON functions and PostgreSQL reject them on read or write).
- Times lie between ``MIN_TIME`` and ``MAX_TIME`` in UTC: year 1 to 9999 with two days of
  room at either end, so converting to any timezone and day arithmetic cannot overflow.
- Sizes: message count, text per message and per exchange, stored bytes of messages and
  metadata, nesting depth (``config.Limits``).
"""

from __future__ import annotations

import json
import math
import unicodedata
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from .config import Limits
from .errors import ValidationError
from .render import message_text
from .store.base import MARKS_KEY, ExchangeFilter

ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
MAX_ID = 256
MAX_NAME = 64
#: The largest sequence number or count a store can hold (SQLite and PostgreSQL BIGINT).
MAX_INT = 2**63 - 1
MIN_TIME = datetime(1, 1, 3, tzinfo=timezone.utc)
MAX_TIME = datetime(9999, 12, 29, 23, 59, 59, 999999, tzinfo=timezone.utc)
#: Metadata key the organiser keeps its marks under; callers may not set it (a forged mark
#: would render as "(superseded)" and steer recall).
RESERVED_KEY = MARKS_KEY
# Characters that end a line for str.splitlines() (and for a reader of the rendered context).
_LINE_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


def _unicode(value: str, what: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates cannot be stored as UTF-8
        raise ValidationError(f"{what} is not valid Unicode text: {exc.reason}") from None


def _ident(value: object, what: str, *, required: bool) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise ValidationError(f"{what} must be a string, got {type(value).__name__}")
    if (required and not value.strip()) or len(value) > MAX_ID or "\x00" in value:
        raise ValidationError(f"{what} must be a{' non-empty' if required else ''} string of at most "
                              f"{MAX_ID} characters without NUL")
    _unicode(value, what)
    return value


#: Characters a user id may not hold: it is a path segment of the HTTP API
#: (``/v1/users/{user_id}/...``) and a label in logs and the CLI, so it must survive both.
USER_ID_RULE = ("a user id is 1-256 characters of printable text without surrounding spaces, "
                "'/', '\\' or '..'")


def user_id(value: object) -> str:
    """The one rule for user ids, behind every door (Python, HTTP, MCP, CLI, integrations):
    1-256 characters, valid Unicode, no control or line-break characters (NUL, newline, tab,
    U+2028 ...), no leading or trailing whitespace, no ``/`` or ``\\`` (a user id is one
    segment of an HTTP path; ``a/b`` could never be reached there) and no ``..``."""
    if not isinstance(value, str):
        raise ValidationError(f"user_id must be a string, got {type(value).__name__}")
    if not value or not value.strip():
        raise ValidationError(f"user_id is empty; {USER_ID_RULE}")
    if len(value) > MAX_ID:
        raise ValidationError(f"user_id is {len(value)} characters; {USER_ID_RULE}")
    _unicode(value, "user_id")
    bad = next((c for c in value if c in _LINE_BREAKS or unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")), None)
    if bad is not None:
        raise ValidationError(f"user_id holds the control or format character U+{ord(bad):04X}; {USER_ID_RULE}")
    if value != value.strip():
        raise ValidationError(f"user_id {value!r} starts or ends with whitespace; {USER_ID_RULE}")
    for part in ("/", "\\", ".."):
        if part in value:
            raise ValidationError(f"user_id {value!r} holds {part!r}; {USER_ID_RULE}")
    return value


def session_id(value: object) -> str | None:
    return _ident(value, "session_id", required=False)


def item_id(value: object, what: str) -> str:
    """An exchange, topic or change id given by a caller (looked up, never stored)."""
    out = _ident(value, what, required=True)
    assert out is not None
    return out


def integer(value: object, what: str, low: int = 0, high: int = MAX_INT) -> int:
    """An ``int`` (not a bool: ``True`` is not a count) within ``low..high``."""
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValidationError(f"{what} must be an integer between {low} and {high}")
    return value


def text(value: object, what: str, limit: int) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"{what} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise ValidationError(f"{what} is empty")
    if len(value) > limit:
        raise ValidationError(f"{what} is {len(value)} characters; the limit is {limit}")
    if "\x00" in value:
        raise ValidationError(f"{what} contains a NUL character")
    _unicode(value, what)
    return value


def when(value: object) -> datetime:
    """A timezone-aware datetime from a datetime, ISO string or None (= now, UTC), between
    ``MIN_TIME`` and ``MAX_TIME``. A naive time is taken as UTC."""
    if value is None:
        return datetime.now(timezone.utc)
    if isinstance(value, str):
        raw = value
        try:
            value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError as exc:
            raise ValidationError(f"not an ISO 8601 time: {raw[:64]!r}") from exc
    if not isinstance(value, datetime):
        raise ValidationError(f"time must be a datetime or ISO string, got {type(value).__name__}")
    try:
        if value.tzinfo is None or value.utcoffset() is None:
            value = value.replace(tzinfo=timezone.utc)
        utc = value.astimezone(timezone.utc)
        # A fixed offset: what every store gives back, and no tzinfo code runs on reads.
        value = value.replace(tzinfo=timezone(value.utcoffset()))  # type: ignore[arg-type]
    except (OverflowError, ValueError, TypeError, ArithmeticError) as exc:
        raise ValidationError(f"time {_shown(value)} cannot be converted to UTC: {exc}") from None
    if not MIN_TIME <= utc <= MAX_TIME:
        raise ValidationError(f"time {value.isoformat()} is out of range: between "
                              f"{MIN_TIME.date()} and {MAX_TIME.date()} (UTC)")
    return value


def _shown(value: datetime) -> str:
    try:
        return value.isoformat()
    except Exception:  # a tzinfo whose utcoffset() fails
        return value.replace(tzinfo=None).isoformat() + " (with an unusable timezone)"


def _walk(value: object, what: str, max_depth: int) -> None:
    """Check a JSON value without recursion (a deep value must not exhaust the stack): types,
    finite numbers, valid Unicode strings and keys, nesting at most ``max_depth``."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if item is None or isinstance(item, (bool, int)):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise ValidationError(f"{what} holds {item!r}; only finite numbers are JSON")
        elif isinstance(item, str):
            _unicode(item, what)
        elif isinstance(item, (list, tuple, Mapping)):
            if depth >= max_depth:
                raise ValidationError(f"{what} is nested more than {max_depth} levels deep")
            if isinstance(item, Mapping):
                for k in item:
                    if not isinstance(k, str):
                        raise ValidationError(f"{what} has a key of type {type(k).__name__}; "
                                              "JSON keys are strings")
                    _unicode(k, what)
                stack.extend((x, depth + 1) for x in item.values())
            else:
                stack.extend((x, depth + 1) for x in item)
        else:
            raise ValidationError(f"{what} holds a {type(item).__name__}, which is not JSON")


def json_value(value: object, what: str, max_bytes: int, max_depth: int) -> tuple[Any, int]:
    """A JSON-safe copy of ``value`` (what a store will hand back) and its stored size."""
    _walk(value, what, max_depth)
    try:
        raw = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValidationError(f"{what} must be JSON-serialisable: {exc}") from None
    size = len(raw.encode("utf-8"))
    if size > max_bytes:
        raise ValidationError(f"{what} is {size} bytes as JSON; the limit is {max_bytes}")
    return json.loads(raw), size


def metadata(value: object, limits: Limits | None = None) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValidationError(f"metadata must be a mapping, got {type(value).__name__}")
    lim = limits or Limits()
    if RESERVED_KEY in value:
        raise ValidationError(f"metadata key {RESERVED_KEY!r} is reserved for arbormem's own marks")
    out, _ = json_value(dict(value), "metadata", lim.max_metadata_bytes, lim.max_json_depth)
    return out


def name(value: object, what: str) -> str | None:
    """An OpenAI-style participant ``name``: one line of at most 64 characters, without control
    characters or ':' (the speaker separator of the rendered context), and not a role name
    (a message named "assistant" would read as the assistant's line). None when absent."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError(f"{what} must be a string, got {type(value).__name__}")
    _unicode(value, what)
    stripped = value.strip()
    if (not stripped or len(value) > MAX_NAME or ":" in value
            or any(c in _LINE_BREAKS or unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in value)):
        raise ValidationError(f"{what} must be one non-empty line of at most {MAX_NAME} characters, "
                              "without control characters or ':'")
    if stripped.casefold() in ROLES:
        raise ValidationError(f"{what} {stripped!r} is a role name; a participant name must differ")
    return stripped


def messages(value: object, limit: int, limits: Limits | None = None) -> tuple[list[dict[str, Any]], str, str]:
    """Validate OpenAI-format messages; return (messages, user_text, assistant_text).

    ``limit`` bounds one message's text; ``limits`` the count, the total text, the stored bytes
    and the nesting of the whole exchange."""
    lim = limits or Limits()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise ValidationError("messages must be a non-empty list of {'role', 'content'} dicts")
    if len(value) > lim.max_messages:
        raise ValidationError(f"an exchange has {len(value)} messages; the limit is {lim.max_messages}")
    out: list[dict[str, Any]] = []
    users: list[str] = []
    assistants: list[str] = []
    chars = 0
    size = 0
    for i, msg in enumerate(value):
        if not isinstance(msg, Mapping):
            raise ValidationError(f"messages[{i}] must be a dict, got {type(msg).__name__}")
        role = msg.get("role")
        if not isinstance(role, str) or role not in ROLES:
            shown = role if isinstance(role, str) and len(role) <= 32 else type(role).__name__
            raise ValidationError(f"messages[{i}] has unknown role {shown!r}; use one of {sorted(ROLES)}")
        content = msg.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ValidationError(f"messages[{i}].content must be a string or a list of parts")
        # Types, finite numbers, Unicode and depth first: message_text reads the parts.
        stored, n = json_value(dict(msg), f"messages[{i}]", lim.max_exchange_bytes, lim.max_json_depth)
        size += n
        if size > lim.max_exchange_bytes:
            raise ValidationError(f"the messages are more than {lim.max_exchange_bytes} bytes as JSON; "
                                  "that is the limit for one exchange")
        body = message_text(msg)
        speaker = name(msg.get("name"), f"messages[{i}].name")
        if body:
            text(body, f"messages[{i}].content", limit)
            chars += len(body)
            if chars > lim.max_exchange_chars:
                raise ValidationError(f"the messages hold more than {lim.max_exchange_chars} characters of "
                                      "text; that is the limit for one exchange")
            if speaker:
                # The participant's name is part of what is indexed ("Maria: ..."), so a question
                # that names a person finds that person's own messages.
                body = f"{speaker}: {body}"
        if role == "user":
            users.append(body)
        elif role == "assistant":
            assistants.append(body)
        out.append(stored)
    user_text = "\n".join(u for u in users if u)
    if not user_text.strip():
        raise ValidationError("an exchange needs a user message with non-empty content")
    return out, user_text, "\n".join(a for a in assistants if a)


def exchange_filter(session_id: object = None, since: object = None, until: object = None,
                    metadata: object = None) -> ExchangeFilter | None:
    """The filter of a recall or search (issue 18), or None when nothing is asked: a session id,
    a time range ``since <= user_at < until`` (datetimes or ISO strings, naive = UTC) and
    equality on metadata keys (JSON scalars: str, int, float, bool, None)."""
    meta: dict[str, Any] = {}
    if metadata is not None:
        if not isinstance(metadata, Mapping):
            raise ValidationError(f"metadata filter must be a mapping, got {type(metadata).__name__}")
        for key, value in metadata.items():
            _ident(key, "metadata filter key", required=True)
            if value is not None and not isinstance(value, (str, int, float, bool)):
                raise ValidationError(f"metadata filter {key!r}: only str, int, float, bool or None "
                                      f"compare, got {type(value).__name__}")
            if isinstance(value, float) and not math.isfinite(value):
                raise ValidationError(f"metadata filter {key!r} must be a finite number")
            if isinstance(value, str):
                _unicode(value, f"metadata filter {key!r}")
            meta[key] = value
    lo = None if since is None else when(since)
    hi = None if until is None else when(until)
    if lo is not None and hi is not None and lo >= hi:
        raise ValidationError("since must be before until")
    out = ExchangeFilter(session_id=_ident(session_id, "session_id", required=False), since=lo, until=hi,
                         metadata=meta)
    return out or None

