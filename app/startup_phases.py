"""Where a cold start goes: each start-up phase's wall time, logged as ``startup: NAME S s``.

``voxlane serve --log-level debug`` prints one line per phase (imports, each model's load and
warm-up, the page, the whole start since the process began); ``voxlane bench startup`` reads them.
At the info level one line sums them up once the server is ready (``started in S s: ...``).
Phases may overlap (the models load on threads of their own): their sum is not the start's length.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time

log = logging.getLogger("voxlane.startup")


def seconds_since_process_start() -> float:
    """Wall seconds since this process was created (the OS's start time: interpreter start-up
    and imports included); 0.0 where the OS does not say."""
    try:
        import psutil

        return max(0.0, time.time() - psutil.Process().create_time())
    except Exception:  # psutil missing or no /proc: the phases still log
        return 0.0


class StartupPhases:
    """Records named phases (thread-safe: loaders time themselves from their own threads)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    def record(self, name: str, seconds: float) -> None:
        with self._lock:
            self.seconds[name] = seconds
        log.debug("startup: %s %.3f s", name, seconds)

    def summary(self) -> str:
        """Every phase so far, ``name S s`` in the order they ended."""
        with self._lock:
            return ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self.seconds.items())

    @contextlib.contextmanager
    def phase(self, name: str):
        """Times the block as phase ``name`` (recorded even when it raises: a slow failure shows)."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.record(name, time.monotonic() - started)
