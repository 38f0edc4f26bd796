"""A speaker with no device: plays the pipeline's audio in real time and reports the position,
exactly as a front end should (pause on PlaybackPause, drop old turns on Interrupt)."""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

import numpy as np

from pipeline.frames import AudioOut, Frame, Interrupt, PlaybackPause, PlaybackResume


class VirtualPlayer:
    """Consumes output frames via ``on_frame``; a thread advances playback every ``tick_s``.

    ``report(gen, played_samples)`` is the pipeline's ``report_playback``. ``input_clock()``
    returns how many input samples had been pushed, to measure barge-in in audio time.
    """

    def __init__(self, report: Callable[[int, int], None], input_clock: Callable[[], int] = lambda: 0,
                 tick_s: float = 0.01):
        self.report = report
        self.input_clock = input_clock
        self.tick_s = tick_s
        self._queue: deque[AudioOut] = deque()
        self._current: AudioOut | None = None
        self._offset = 0  # samples of _current already played
        self._is_paused = False
        self._lock = threading.Lock()
        self.played: dict[int, list[np.ndarray]] = {}  # gen -> played pieces
        self.played_samples: dict[int, int] = {}
        self.sample_rate: dict[int, int] = {}
        self.t_first_played: dict[int, float] = {}
        self.stops: list[dict] = []  # each time playback was stopped by a pause or an interrupt
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="virtual-player", daemon=True)
        self._thread.start()

    def on_frame(self, frame: Frame) -> None:
        with self._lock:
            if isinstance(frame, AudioOut):
                self._queue.append(frame)
                self.sample_rate[frame.gen] = frame.sample_rate
            elif isinstance(frame, PlaybackPause):
                self._note_stop("pause", frame.gen)
                self._is_paused = True
            elif isinstance(frame, PlaybackResume):
                self._is_paused = False
            elif isinstance(frame, Interrupt):
                self._note_stop("interrupt", frame.gen)
                if self._current is not None and self._current.gen < frame.gen:
                    self.report(self._current.gen, self.played_samples.get(self._current.gen, 0))
                    self._current = None
                self._queue = deque(f for f in self._queue if f.gen >= frame.gen)
                self._is_paused = False

    def _note_stop(self, kind: str, gen: int) -> None:
        playing = self._current if self._current is not None else (self._queue[0] if self._queue else None)
        if playing is not None and not self._is_paused:
            self.report(playing.gen, self.played_samples.get(playing.gen, 0))
            self.stops.append({"kind": kind, "gen": playing.gen, "input_sample": self.input_clock(),
                               "t": time.monotonic()})

    def is_idle(self) -> bool:
        with self._lock:
            return self._current is None and not self._queue

    def audio(self, gen: int) -> np.ndarray:
        pieces = self.played.get(gen, [])
        return np.concatenate(pieces) if pieces else np.zeros(0, np.int16)

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.tick_s):
            now = time.monotonic()
            elapsed, last = now - last, now
            with self._lock:
                if not self._is_paused:
                    self._advance(elapsed, now)

    def _advance(self, elapsed: float, now: float) -> None:
        budget = elapsed
        while budget > 0:
            if self._current is None:
                if not self._queue:
                    return
                self._current, self._offset = self._queue.popleft(), 0
            frame = self._current
            n = min(len(frame.pcm) - self._offset, int(round(budget * frame.sample_rate)))
            if n <= 0 and len(frame.pcm) > self._offset:
                return
            piece = frame.pcm[self._offset:self._offset + n]
            self.t_first_played.setdefault(frame.gen, now)
            self.played.setdefault(frame.gen, []).append(piece)
            self.played_samples[frame.gen] = self.played_samples.get(frame.gen, 0) + n
            self._offset += n
            budget -= n / frame.sample_rate
            if self._offset >= len(frame.pcm):
                self._current = None
            self.report(frame.gen, self.played_samples[frame.gen])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
