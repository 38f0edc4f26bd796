"""Per-session limits that need a clock: a token bucket for message and audio rates, and the
turn watchdog that notices a stage that stopped producing (an LLM or TTS that stalls)."""
from __future__ import annotations

import time

from pipeline import frames as f


class TokenBucket:
    """``rate`` units per second, at most ``burst`` saved up; ``take`` says whether ``cost`` fits."""

    def __init__(self, rate: float, burst: float, clock=time.monotonic):
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._level = burst
        self._last = clock()

    def take(self, cost: float = 1.0) -> bool:
        now = self._clock()
        self._level = min(self.burst, self._level + (now - self._last) * self.rate)
        self._last = now
        if cost > self._level:
            return False
        self._level -= cost
        return True


class TurnWatch:
    """Follows the turn in flight from the pipeline's output frames. A turn starts when the user's
    turn is over (``SpeechEnded`` or a final transcript), or with the ``Interrupt`` that opens a
    typed turn or a spoken notice,
    and ends with ``TurnDone`` or a newer ``Interrupt``; ``stalled`` reports it when no frame of it
    came for ``timeout_s``."""

    def __init__(self, timeout_s: float, clock=time.monotonic):
        self.timeout_s = timeout_s
        self._clock = clock
        self.gen: int | None = None
        self._last = 0.0
        self._last_frame: f.Frame | None = None

    def on_frame(self, frame: f.Frame) -> None:
        gen = frame.gen
        if isinstance(frame, f.Interrupt) and self.gen is not None and gen > self.gen:
            self.gen = None
        if isinstance(frame, f.TurnDone) and gen == self.gen:
            self.gen = None
            return
        if isinstance(frame, f.Transcript) and frame.is_final and not frame.text.strip():
            if gen == self.gen:
                self.gen = None  # nothing intelligible was said: no answer follows
            return
        # A typed turn is watched from its first frame, the Interrupt that opens it (it reaches the
        # output at once, whatever the stages are busy with); a spoken notice (the apology) likewise.
        starts = (isinstance(frame, f.SpeechEnded) or (isinstance(frame, f.Transcript) and frame.is_final)
                  or (isinstance(frame, f.Interrupt) and frame.reason in ("text", "notice")))
        if starts and (self.gen is None or gen > self.gen):
            self.gen = gen
        if gen == self.gen:
            self._last = self._clock()
            self._last_frame = frame

    def stalled(self) -> tuple[int, str] | None:
        """(gen, the stage it waits for) once the turn in flight made no progress for timeout_s."""
        if self.gen is None or self._clock() - self._last < self.timeout_s:
            return None
        last = self._last_frame
        if isinstance(last, f.SpeechEnded):
            stage = "asr"
        elif isinstance(last, (f.SpeakChunk, f.AssistantDone)) or _is_notice(last):
            stage = "tts"
        else:
            stage = "llm"
        gen, self.gen = self.gen, None
        return gen, stage


def _is_notice(frame: f.Frame | None) -> bool:
    return isinstance(frame, f.Interrupt) and frame.reason == "notice"
