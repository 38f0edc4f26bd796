"""Turn-taking from VAD probabilities: a small state machine, one 32 ms frame at a time.

idle ──p ≥ pause_threshold──► onset ──min_speech_ms voiced──► speaking ──end silence──► idle
                   └──onset_gap_ms silent──► idle (a blip: cough, click; never a turn)

``onset`` is reported at once so playback can pause within one frame; ``start`` only once the
sound has lasted min_speech_ms, so a cough never interrupts. ``pause`` (answer_pause_ms of
silence inside a turn) starts the answer speculatively; ``judge`` (pause_ms of silence) is when the
end-of-turn signals are read; ``resume`` (speech again after a pause) voids the answer; ``end``
commits the turn. The answer starts before the judging pause because it is cheap to throw away
(a new gen drops it unheard) and the path after the last word is what the user waits for. How much silence ends it is the caller's to say at every frame
(``end_silence_ms``): the persona's fixed ``silence_ms``, or what the end-of-turn signals decided
(pipeline/endpointing/); ``poll`` applies a decision that arrives between frames.
"""
from __future__ import annotations

from pipeline.config import VADConfig
from pipeline.persona.persona import Endpointing

FRAME_MS = 32


class TurnDetector:
    """Feed ``update(prob)`` per frame; it returns the events that frame caused."""

    def __init__(self, config: VADConfig):
        self.config = config
        self.state = "idle"
        self.endpointing = Endpointing()
        self.is_voiced = False
        self._voiced_ms = 0
        self._silent_ms = 0
        self._is_pause_sent = False  # "pause": the answer to the words so far has started
        self._is_judge_sent = False  # "judge": the end-of-turn signals of this pause are being read

    @property
    def silent_ms(self) -> int:
        """The silence so far inside a turn (0 outside one)."""
        return self._silent_ms if self.state == "speaking" else 0

    @property
    def answer_pause_ms(self) -> int:
        """The silence after which the answer starts: never later than the judging pause."""
        return min(self.config.answer_pause_ms, self.config.pause_ms)

    def update(self, prob: float, endpointing: Endpointing | None = None, end_silence_ms: int | None = None) -> list[str]:
        """``endpointing`` is read at each onset (the persona may have changed since the last turn);
        ``end_silence_ms`` (default: its ``silence_ms``) is the silence that ends the turn now."""
        # Hysteresis: entering speech takes `threshold`, staying in it only `neg_threshold`.
        limit = self.config.neg_threshold if self.is_voiced else self.config.threshold
        self.is_voiced = prob >= limit
        events: list[str] = []
        if self.state == "idle":
            # Silero's probability climbs over a frame or two at an onset; pausing playback at a
            # lower bar wins a frame (32 ms) of barge-in latency, and costs nothing if it was a blip.
            if prob >= self.config.pause_threshold:
                self.endpointing = endpointing or self.endpointing
                self.state, self._voiced_ms, self._silent_ms = "onset", FRAME_MS if self.is_voiced else 0, 0
                events.append("onset")
                events += self._maybe_start()
        elif self.state == "onset":
            if self.is_voiced:
                self._voiced_ms += FRAME_MS
                self._silent_ms = 0
                events += self._maybe_start()
            else:
                self._silent_ms += FRAME_MS
                if self._silent_ms >= self.config.onset_gap_ms:
                    self.state = "idle"
                    events.append("blip")
        elif self.state == "speaking":
            if self.is_voiced:
                if self._is_pause_sent:
                    events.append("resume")  # the speculative answer to the words so far is void
                self._silent_ms, self._is_pause_sent, self._is_judge_sent = 0, False, False
            else:
                self._silent_ms += FRAME_MS
                if self._silent_ms >= self.answer_pause_ms and not self._is_pause_sent:
                    self._is_pause_sent = True
                    events.append("pause")  # always before "judge" and "end": the answer starts first
                if self._silent_ms >= self.config.pause_ms and not self._is_judge_sent:
                    self._is_judge_sent = True
                    events.append("judge")
                events += self.poll(end_silence_ms)
        return events

    def poll(self, end_silence_ms: int | None = None) -> list[str]:
        """["end"] if the silence so far already ends the turn, else []."""
        required = self.endpointing.silence_ms if end_silence_ms is None else end_silence_ms
        if self.state == "speaking" and self._silent_ms > 0 and self._silent_ms >= required:
            self.state = "idle"
            return ["end"]
        return []

    def _maybe_start(self) -> list[str]:
        if self._voiced_ms >= self.endpointing.min_speech_ms:
            self.state, self._silent_ms, self._is_pause_sent, self._is_judge_sent = "speaking", 0, False, False
            return ["start"]
        return []
