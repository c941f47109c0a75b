"""Helpers shared by the robustness tests: real SQLite files and the hash embedder."""

from __future__ import annotations

from arbormem import Memory


def turn(user: str, assistant: str) -> list[dict[str, str]]:
    """One exchange in OpenAI message format."""
    return [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]


def open_memory(path: object) -> Memory:
    """A file memory with the deterministic embedder (no model load)."""
    return Memory(str(path), embedder="hash")
