"""Half-duplex echo suppression for open speakers: the assistant must not answer itself.

While the assistant's voice plays (and ``tail_ms`` after, for the room's reverberation and the
device's output latency), a microphone block passes only when it is clearly louder than what the
speakers are putting out (``barge_in_ratio`` times the recent playback level) — the user talking
over the assistant. Quieter blocks, which is what the speakers' own echo is, become silence.

This is the "at least half-duplex" option of the issue: cheap, model-free, robust to any device
latency. Its price: to barge in, the user must speak louder than the echo (``--barge-in-ratio``
sets how much louder). With headphones, ``--no-echo-gate`` turns it off.
"""
from __future__ import annotations

import collections
import threading
import time

import numpy as np


def rms(block: np.ndarray) -> float:
    if block.size == 0:
        return 0.0
    return float(np.sqrt(np.mean(np.square(block.astype(np.float32) / 32768.0))))


class EchoGate:
    """Silences microphone blocks that are probably the speakers' echo (see the module docstring)."""

    def __init__(self, barge_in_ratio: float = 2.0, floor: float = 0.003, tail_ms: int = 300,
                 window_ms: int = 300):
        self.barge_in_ratio = barge_in_ratio
        self.floor = floor  # playback below this level (near silence) does not gate the mic
        self.tail_s = tail_ms / 1000
        self.window_s = window_ms / 1000
        self._levels: collections.deque[tuple[float, float]] = collections.deque()  # (time, playback rms)
        self._lock = threading.Lock()  # played() runs on the audio output thread, process() on input
        self.num_suppressed = 0
        self.num_passed_during_playback = 0

    def played(self, block: np.ndarray) -> None:
        """Record a block that was just sent to the speakers."""
        level = rms(block)
        now = time.monotonic()
        with self._lock:
            if level > self.floor:
                self._levels.append((now, level))
            while self._levels and now - self._levels[0][0] > self.window_s + self.tail_s:
                self._levels.popleft()

    def reference_level(self) -> float:
        """The loudest recent playback level (0 when nothing played lately)."""
        with self._lock:
            now = time.monotonic()
            return max((lvl for t, lvl in self._levels if now - t <= self.window_s + self.tail_s), default=0.0)

    def process(self, block: np.ndarray) -> np.ndarray:
        """The microphone block, or silence of the same length when it is likely echo."""
        reference = self.reference_level()
        if reference == 0.0:
            return block
        if rms(block) > self.barge_in_ratio * reference:
            self.num_passed_during_playback += 1
            return block
        self.num_suppressed += 1
        return np.zeros_like(block)
