"""The turn counter shared by the stages that open turns (VAD, typed input, interrupt())."""
from __future__ import annotations

import threading


class TurnCounter:
    """Hands out increasing turn numbers (``gen``); one per pipeline (per session)."""

    def __init__(self) -> None:
        self._value = 0
        self._lock = threading.Lock()

    @property
    def current(self) -> int:
        return self._value

    def next(self) -> int:
        with self._lock:
            self._value += 1
            return self._value
