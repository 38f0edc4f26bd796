"""The open sessions, capped at ``max_sessions``: one more is refused, never queued silently. And
the sockets that have not sent ``start`` yet, capped on their own (in all and per client address),
so sockets without the token can never take a started session's place."""
from __future__ import annotations

import itertools
import threading
from collections import Counter


class SessionLimitReached(Exception):
    """All ``max_sessions`` places are taken (or all places for sockets not started yet)."""


class SessionRegistry:
    """Hands out session ids while there is room; ``release`` gives the place back."""

    def __init__(self, max_sessions: int, max_pending: int = 16, max_pending_per_client: int = 8):
        self.max_sessions = max_sessions
        self.max_pending = max_pending
        self.max_pending_per_client = max_pending_per_client
        self._pending: Counter[str] = Counter()  # client address -> sockets not started (event loop only)
        self._open: set[str] = set()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # the UI thread (healthz) and the event loop both read it
        self.num_opened = 0

    @property
    def num_pending(self) -> int:
        return sum(self._pending.values())

    def enter_pending(self, client: str) -> None:
        """A new socket, not started yet; raises SessionLimitReached when there is no room for it."""
        if self.num_pending >= self.max_pending:
            raise SessionLimitReached(f"{self.max_pending} sockets are waiting to start (server.max_pending_sockets)")
        if self._pending[client] >= self.max_pending_per_client:
            raise SessionLimitReached(f"{self.max_pending_per_client} sockets of this address are waiting to start "
                                      "(server.max_pending_per_client)")
        self._pending[client] += 1

    def leave_pending(self, client: str) -> None:
        self._pending[client] -= 1
        if self._pending[client] <= 0:
            del self._pending[client]

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
