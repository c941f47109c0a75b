"""The background organiser: consolidates a user's memory once it has been idle for a while.

``Organizer(mem, idle_seconds=300).start()`` runs a daemon thread that polls the store every
``interval`` seconds. A user counts as active while their newest exchange keeps changing
(new sequence numbers or statuses); once nothing changed for ``idle_seconds`` and something
was written since the last run, ``Memory.consolidate`` runs for that user.

It never blocks ``begin``/``complete``/``recall``: consolidation writes in short
transactions (a batch of exchanges, or one merge pass) and calls the LLM with no transaction
open, so a writer waits at most for one short transaction. Failures never stop the thread:
each is logged (``logging``, logger ``arbormem.organizer``) and kept in ``errors`` (the most
recent ``keep_errors``), and the user is retried after the next idle period.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from ..errors import ConfigError
from .models import ConsolidationReport

if TYPE_CHECKING:  # pragma: no cover
    from ..memory import Memory

log = logging.getLogger("arbormem.organizer")


@dataclass(frozen=True)
class OrganizerError:
    """One failed consolidation run."""

    user_id: str
    at: datetime
    error: str


@dataclass
class _UserState:
    fingerprint: tuple[int, str] | None = None
    changed_at: float = 0.0
    done_fingerprint: tuple[int, str] | None = None


class Organizer:
    """Runs ``mem.consolidate(user)`` for users idle at least ``idle_seconds``.

    ``users`` limits it to some users (default: every user in the store). ``clock`` is the
    monotonic clock (a parameter so tests can drive time without sleeping minutes).
    """

    def __init__(
        self,
        mem: Memory,
        *,
        idle_seconds: float = 300.0,
        interval: float = 5.0,
        users: Sequence[str] | None = None,
        keep_errors: int = 50,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if idle_seconds < 0 or interval <= 0:
            raise ConfigError("idle_seconds must be >= 0 and interval > 0")
        self.mem = mem
        self.idle_seconds = idle_seconds
        self.interval = interval
        self.users = list(users) if users is not None else None
        self.clock = clock
        self.errors: deque[OrganizerError] = deque(maxlen=keep_errors)
        self.reports: deque[ConsolidationReport] = deque(maxlen=keep_errors)
        self.runs = 0
        self._state: dict[str, _UserState] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> Organizer:
        """Start the background thread (a daemon: it never keeps the process alive)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return self
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="arbormem-organizer", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        """Ask the thread to stop and wait for the current run to finish."""
        self._stop.set()
        t = self._thread
        if t is not None:
            t.join(timeout)
        self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> Organizer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # the loop itself must survive a broken store read
                log.exception("organizer poll failed")
                self.errors.append(OrganizerError("*", datetime.now(timezone.utc), "poll failed"))
            self._stop.wait(self.interval)

    # -- one poll -------------------------------------------------------------------------------
    def tick(self) -> list[ConsolidationReport]:
        """One poll: note activity, consolidate every user idle long enough. Returns reports."""
        now = self.clock()
        out = []
        for uid in self.users if self.users is not None else self.mem.store.list_users():
            if self._stop.is_set():
                break
            newest = self.mem.store.list_exchanges(uid, limit=1, newest_first=True)
            fp = (newest[0].seq, newest[0].status) if newest else (0, "")
            st = self._state.setdefault(uid, _UserState(changed_at=now))
            if fp != st.fingerprint:
                st.fingerprint, st.changed_at = fp, now
            if fp == st.done_fingerprint or now - st.changed_at < self.idle_seconds:
                continue
            try:
                report = self.mem.consolidate(uid)
            except Exception as exc:
                log.exception("consolidation failed for user %s", uid)
                self.errors.append(OrganizerError(uid, datetime.now(timezone.utc), f"{type(exc).__name__}: {exc}"))
                st.changed_at = now  # retry after another idle period, not on every poll
                continue
            assert isinstance(report, ConsolidationReport)
            st.done_fingerprint = fp
            self.runs += 1
            self.reports.append(report)
            out.append(report)
            log.info("consolidated %s: %d merged, %d linked, %d archived, %d deduplicated, %d superseded "
                     "in %.2fs", uid, report.merged, report.linked, report.archived, report.deduplicated,
                     report.superseded, report.duration)
        return out


__all__ = ["Organizer", "OrganizerError"]
