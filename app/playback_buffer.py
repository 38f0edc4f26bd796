"""The assistant's voice waiting to be played on a local device: chunks in, fixed-size blocks out.

Written by the network/pipeline side, read by the audio output callback; ``flush`` empties it at
once for barge-in. It counts what was really played per turn (in the turn's own sample rate), so
the pipeline can cut the history at what the user heard.
"""
from __future__ import annotations

import collections
import threading

import numpy as np

from pipeline.audio import resample_once


class PlaybackBuffer:
    """Mono int16 audio at the output device's rate ``rate_hz``."""

    def __init__(self, rate_hz: int):
        self.rate_hz = rate_hz
        self._chunks: collections.deque[tuple[int, np.ndarray, float]] = collections.deque()  # gen, pcm, src/dst ratio
        self._offset = 0
        self._lock = threading.Lock()
        self.heard: dict[int, float] = {}  # gen -> samples played, at that turn's source rate
        self.min_gen = 0
        self.is_paused = False
        self.num_played = 0
        self.num_non_silent = 0

    def push(self, gen: int, pcm: np.ndarray, sample_rate_hz: int) -> None:
        """Queue one chunk of turn ``gen`` (dropped if that turn was interrupted)."""
        if gen < self.min_gen:
            return
        # Each chunk whole, not through a streaming resampler: that would hold back its last
        # ~25 ms until the next chunk, clipping the end of every reply. TTS chunks start and end
        # in silence, so there is no seam to smooth.
        out = resample_once(np.asarray(pcm, np.int16), sample_rate_hz, self.rate_hz)
        with self._lock:
            if gen >= self.min_gen and out.size:
                self._chunks.append((gen, out, sample_rate_hz / self.rate_hz))

    def flush(self, keep_from_gen: int) -> None:
        """Drop everything of turns older than ``keep_from_gen`` (barge-in)."""
        with self._lock:
            self.is_paused = False  # a pause is over once the interruption it announced happens
            self.min_gen = max(self.min_gen, keep_from_gen)
            if self._chunks and self._chunks[0][0] < self.min_gen:
                self._offset = 0  # the chunk being played is dropped: the next starts at its beginning
            self._chunks = collections.deque(c for c in self._chunks if c[0] >= self.min_gen)

    def read(self, num_samples: int) -> np.ndarray:
        """Exactly ``num_samples`` samples: queued audio, then silence."""
        out = np.zeros(num_samples, np.int16)
        written = 0
        with self._lock:
            while not self.is_paused and written < num_samples and self._chunks:
                gen, chunk, ratio = self._chunks[0]
                n = min(num_samples - written, len(chunk) - self._offset)
                out[written:written + n] = chunk[self._offset:self._offset + n]
                self._offset += n
                written += n
                self.heard[gen] = self.heard.get(gen, 0.0) + n * ratio
                if self._offset >= len(chunk):
                    self._chunks.popleft()
                    self._offset = 0
        self.num_played += written
        self.num_non_silent += int(np.count_nonzero(np.abs(out[:written].astype(np.int32)) > 32))
        return out

    @property
    def num_buffered(self) -> int:
        with self._lock:
            return sum(len(c[1]) for c in self._chunks) - self._offset

    def is_playing(self) -> bool:
        return self.num_buffered > 0 and not self.is_paused
