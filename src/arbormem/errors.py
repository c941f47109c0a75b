"""The one exception hierarchy of arbormem.

Every error the library raises on purpose is an ``ArbormemError``; callers can catch that one
class, or a narrower one below it. The CLI maps them to one-line messages and exit codes, the
HTTP layer to status codes (see ``code`` / ``http_status``).

    ArbormemError
    ├── ValidationError          bad input: empty text, unknown role, wrong type, too large
    │   └── ImportFormatError    a malformed import file (carries the line number)
    ├── NotFoundError            unknown exchange / topic / change id
    ├── StateError               an operation not allowed in the object's current state
    │   │                        (completing a failed exchange, undoing twice, ...)
    │   └── ConfirmationRequired forgetting a theme (several topics) without confirm=True;
    │                            carries the preview (``report``: what would go)
    ├── StoreError               the storage backend failed or is busy past the retry budget
    │   └── MigrationError       the database schema is newer than this library
    ├── EmbeddingError           the embedder failed or returned unusable vectors
    ├── LLMError                 the LLM endpoint failed or answered something invalid
    │                            (never escapes from organiser/recall: they fall back offline)
    └── ConfigError              contradictory or missing configuration
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .models import ForgetReport


class ArbormemError(Exception):
    """Base class of every error arbormem raises on purpose."""

    code = "error"
    http_status = 500


class ValidationError(ArbormemError, ValueError):
    """The caller passed something arbormem cannot store or act on."""

    code = "invalid_input"
    http_status = 422


class ImportFormatError(ValidationError):
    """An import file is malformed; ``line`` is the 1-based line (JSONL) or item number."""

    code = "invalid_import"

    def __init__(self, message: str, line: int | None = None) -> None:
        self.line = line
        super().__init__(f"line {line}: {message}" if line is not None else message)


class NotFoundError(ArbormemError, KeyError):
    """No exchange, topic or change with that id (for this user)."""

    code = "not_found"
    http_status = 404

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "not found"


class StateError(ArbormemError):
    """The operation is not allowed in the object's current state."""

    code = "invalid_state"
    http_status = 409


class ConfirmationRequired(StateError):
    """Forgetting a theme (a node holding more than one topic) needs an explicit confirmation.

    ``report`` is the preview (a ``ForgetReport`` with ``applied=False``): exactly which
    exchanges and topics would go. Nothing was deleted.
    """

    code = "confirmation_required"
    http_status = 409

    def __init__(self, message: str, report: ForgetReport) -> None:
        super().__init__(message)
        self.report = report


class StoreError(ArbormemError):
    """The storage backend failed, or stayed locked past the retry budget."""

    code = "store_error"
    http_status = 503


class MigrationError(StoreError):
    """The database was written by a newer arbormem, or a migration failed."""

    code = "migration_error"
    http_status = 500


class EmbeddingError(ArbormemError):
    """The embedder failed or returned vectors that cannot be used (NaN, inf, wrong size)."""

    code = "embedding_error"
    http_status = 502


class LLMError(ArbormemError):
    """The LLM endpoint failed, timed out, refused, or answered invalid output."""

    code = "llm_error"
    http_status = 502


class ConfigError(ArbormemError):
    """Contradictory or missing configuration."""

    code = "config_error"
    http_status = 500


__all__ = [
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
