"""Input validation for the public API: every check runs before anything is stored."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from .errors import ValidationError
from .retrieve.render import message_text

ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
MAX_ID = 256
MAX_NAME = 64


def user_id(value: object) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"user_id must be a string, got {type(value).__name__}")
    if not value.strip() or len(value) > MAX_ID or "\x00" in value:
        raise ValidationError("user_id must be a non-empty string of at most 256 characters")
    return value


def session_id(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_ID or "\x00" in value:
        raise ValidationError("session_id must be a string of at most 256 characters or None")
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
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates cannot be stored as UTF-8
        raise ValidationError(f"{what} is not valid Unicode text: {exc.reason}") from exc
    return value


def when(value: object) -> datetime:
    """A timezone-aware datetime from a datetime, ISO string or None (= now, UTC)."""
    if value is None:
        return datetime.now(timezone.utc)
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError as exc:
            raise ValidationError(f"not an ISO 8601 time: {value!r}") from exc
    if not isinstance(value, datetime):
        raise ValidationError(f"time must be a datetime or ISO string, got {type(value).__name__}")
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


def metadata(value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValidationError(f"metadata must be a mapping, got {type(value).__name__}")
    import json

    try:
        return json.loads(json.dumps(dict(value)))
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"metadata must be JSON-serialisable: {exc}") from exc


def name(value: object, what: str) -> str | None:
    """An OpenAI-style participant ``name``: one line of at most 64 characters, or None."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError(f"{what} must be a string, got {type(value).__name__}")
    if not value.strip() or len(value) > MAX_NAME or any(c in value for c in "\n\r\x00"):
        raise ValidationError(f"{what} must be one non-empty line of at most {MAX_NAME} characters")
    return value.strip()


def messages(value: object, limit: int) -> tuple[list[dict[str, Any]], str, str]:
    """Validate OpenAI-format messages; return (messages, user_text, assistant_text)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise ValidationError("messages must be a non-empty list of {'role', 'content'} dicts")
    out: list[dict[str, Any]] = []
    users: list[str] = []
    assistants: list[str] = []
    for i, msg in enumerate(value):
        if not isinstance(msg, Mapping):
            raise ValidationError(f"messages[{i}] must be a dict, got {type(msg).__name__}")
        role = msg.get("role")
        if role not in ROLES:
            raise ValidationError(f"messages[{i}] has unknown role {role!r}; use one of {sorted(ROLES)}")
        content = msg.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ValidationError(f"messages[{i}].content must be a string or a list of parts")
        body = message_text(msg)
        speaker = name(msg.get("name"), f"messages[{i}].name")
        if body:
            text(body, f"messages[{i}].content", limit)
            if speaker:
                # The participant's name is part of what is indexed ("Maria: ..."), so a question
                # that names a person finds that person's own messages.
                body = f"{speaker}: {body}"
        if role == "user":
            users.append(body)
        elif role == "assistant":
            assistants.append(body)
        out.append(metadata(msg))
    user_text = "\n".join(u for u in users if u)
    if not user_text.strip():
        raise ValidationError("an exchange needs a user message with non-empty content")
    return out, user_text, "\n".join(a for a in assistants if a)
