"""The doors of arbormem for other processes: an HTTP API with a web tree explorer
(``app.create_app``, ``arbormem serve``) and an MCP server (``mcp.create_server``,
``arbormem mcp``). Nothing here is imported by ``import arbormem``; FastAPI and the MCP SDK
are optional extras imported when a server is built.
"""

from __future__ import annotations

from typing import Any


def create_app(*args: Any, **kwargs: Any) -> Any:
    """Build the FastAPI app (see :func:`arbormem.server.app.create_app`)."""
    from .app import create_app as _create

    return _create(*args, **kwargs)


__all__ = ["create_app"]
