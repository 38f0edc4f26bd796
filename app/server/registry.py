"""The open sessions, capped at ``max_sessions``: one more is refused, never queued silently."""
from __future__ import annotations

import itertools
import threading


class SessionLimitReached(Exception):
    """All ``max_sessions`` places are taken."""


class SessionRegistry:
    """Hands out session ids while there is room; ``release`` gives the place back. Also counts
    connections, so a flood of sockets that never start cannot pile up either."""

    def __init__(self, max_sessions: int, max_connections: int | None = None):
        self.max_sessions = max_sessions
        self.max_connections = max_connections or 8 * max_sessions
        self.num_connections = 0  # sockets on /ws, started or not (event loop only)
        self._open: set[str] = set()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # the UI thread (healthz) and the event loop both read it
        self.num_opened = 0

    def acquire(self) -> str:
        with self._lock:
            if len(self._open) >= self.max_sessions:
                raise SessionLimitReached(f"{self.max_sessions} sessions are open (server.max_sessions)")
            session_id = f"s{next(self._ids)}"
            self._open.add(session_id)
            self.num_opened += 1
            return session_id

    def release(self, session_id: str) -> None:
        with self._lock:
            self._open.discard(session_id)

    @property
    def num_open(self) -> int:
        with self._lock:
            return len(self._open)
