"""Fixtures for the doors: a real uvicorn server on a loopback socket, seeded memories."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from arbormem import Memory
from tests.conftest import chat

TOKENS = "tok-alice-bob:alice,bob;tok-carol-1:carol;tok-admin-1:*"
A = {"Authorization": "Bearer tok-alice-bob"}
C = {"Authorization": "Bearer tok-carol-1"}
ADMIN = {"Authorization": "Bearer tok-admin-1"}


class LiveServer:
    """uvicorn serving an ASGI app in a thread, on 127.0.0.1 and a free port."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def seed(mem: Memory) -> None:
    """Two users with distinct, recognisable subjects."""
    mem.add_many([
        {"messages": chat("My friend Leo is allergic to peanuts.", "Noted: no peanuts for Leo."),
         "at": "2024-03-01T10:00:00Z"},
        {"messages": chat("We are planning Maya's birthday party in June.", "Indoors or outside?"),
         "at": "2024-03-02T10:00:00Z"},
        {"messages": chat("Outside, in the park, with a chocolate cake.", "Lovely, a park party."),
         "at": "2024-03-02T10:05:00Z"},
    ], user_id="alice")
    mem.add_many([
        {"messages": chat("Carol's secret: the vault code is 7431.", "I will keep it safe."),
         "at": "2024-04-01T09:00:00Z"},
        {"messages": chat("Carol is learning the cello this autumn.", "The cello is wonderful."),
         "at": "2024-04-02T09:00:00Z"},
    ], user_id="carol")


@pytest.fixture
def seeded(tmp_path: Path) -> Iterator[Memory]:
    with Memory(tmp_path / "doors.db", embedder="hash") as mem:
        seed(mem)
        yield mem


@pytest.fixture
def live(seeded: Memory) -> Iterator[LiveServer]:
    from arbormem.server.app import create_app

    server = LiveServer(create_app(seeded, tokens=TOKENS, max_body_bytes=256 * 1024))
    yield server
    server.stop()
