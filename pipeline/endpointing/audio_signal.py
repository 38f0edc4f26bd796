"""Smart Turn off the audio thread: one worker per session scores the turn's audio at a pause.

The VAD must never wait for a 25-65 ms model call (it paces barge-in), and ASR runs its final at
the same pause; so the call runs here and reports back through a callback. Only the newest pause
matters: a request still waiting when a newer one arrives is replaced, never queued behind.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

import numpy as np

from pipeline.endpointing.smart_turn import SmartTurnModel

log = logging.getLogger(__name__)


class AudioTurnScorer:
    """``submit(gen, audio, report)``: ``report(gen, P(complete) or None on failure)`` runs on this
    scorer's thread. ``close()`` ends the thread."""

    def __init__(self, model: SmartTurnModel):
        self.model = model
        self._pending: tuple[int, np.ndarray, Callable[[int, float | None], None]] | None = None
        self._wake = threading.Condition()
        self._is_closed = False
        self._thread = threading.Thread(target=self._run, name="smart-turn", daemon=True)
        self._thread.start()

    def submit(self, gen: int, audio: np.ndarray, report: Callable[[int, float | None], None]) -> None:
        with self._wake:
            self._pending = (gen, audio, report)
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._pending is None and not self._is_closed:
                    self._wake.wait()
                if self._is_closed:
                    return
                gen, audio, report = self._pending
                self._pending = None
            try:
                probability = self.model(audio)
            except Exception:  # the silence rule still ends the turn; say why once per failure
                log.exception("Smart Turn failed on gen %d", gen)
                probability = None
            report(gen, probability)

    def close(self, timeout_s: float = 5.0) -> None:
        with self._wake:
            self._is_closed = True
            self._wake.notify()
        self._thread.join(timeout_s)
