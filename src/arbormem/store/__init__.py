"""Stores: the contract (``base``), the embedded SQLite default, and PostgreSQL (optional)."""

from __future__ import annotations

from .base import ChangeRecord, Store, TopicRecord
from .sqlite import SQLiteStore

__all__ = ["Store", "TopicRecord", "ChangeRecord", "SQLiteStore"]
