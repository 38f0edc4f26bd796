"""One session's end-of-turn bookkeeping between the threads that feed it.

The VAD stage says when the answer to a turn's words starts (``on_answer``, a short pause), then
opens the judging pause (``on_pause``: the audio signal starts on the scorer's thread) and asks,
frame by frame, how much silence ends the turn (``end_silence_ms``). The LLM stage adds the text
signal once ASR's final is in (``add_text``): usually before the judging pause, since the answer
starts earlier; it is kept for that pause of the same turn. When the last expected signal arrives, ``wake(gen)``
asks the VAD stage to apply the verdict at once rather than at its next audio frame.
"""
from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from pipeline.endpointing.audio_signal import AudioTurnScorer
from pipeline.endpointing.decision import PauseSignals, Verdict, end_silence_ms
from pipeline.endpointing.last_word import LastWord
from pipeline.persona.persona import Endpointing


class Endpointer:
    """Thread-safe; ``scorer`` (Smart Turn) may be None, and so may the text signal (``can_probe_text``:
    the LLM backend offers ``probe_sentence_end``)."""

    def __init__(self, scorer: AudioTurnScorer | None, can_probe_text: bool, wake: Callable[[int], None]):
        self.scorer = scorer
        self.can_probe_text = can_probe_text
        self.wake = wake
        self._lock = threading.Lock()
        self._signals: PauseSignals | None = None
        self._endpointing = Endpointing()
        self._verdict: Verdict | None = None
        self._answered: int | None = None  # the turn whose answer started (its probe may come early)
        self._early_text: tuple[int, float | None, float | None, LastWord | None] | None = None
        # (gen, p_text, words_logprob, last_word)

    def on_answer(self, gen: int) -> None:
        """The answer to turn ``gen``'s words starts, before its pause is judged (semantic mode)."""
        with self._lock:
            self._answered, self._early_text = gen, None

    def on_pause(self, gen: int, audio: np.ndarray, endpointing: Endpointing) -> None:
        """A pause in turn ``gen`` (semantic mode): read the signals of the words so far."""
        with self._lock:
            self._signals = PauseSignals(gen, self.scorer is not None, self.can_probe_text)
            self._endpointing, self._verdict = endpointing, None
            early, self._early_text = self._early_text, None
            if early is not None and early[0] == gen:  # the words were probed as the answer started
                self._signals.add("text", early[1])
                self._signals.words_logprob, self._signals.last_word = early[2], early[3]
        if self.scorer is not None:
            self.scorer.submit(gen, audio, lambda g, p: self._add(g, "audio", p))
        else:
            self._add(gen, "audio", None)  # nothing to wait for: a verdict may be ready now

    def wants_text(self, gen: int) -> bool:
        """Whether the LLM stage should probe the final transcript of ``gen``."""
        with self._lock:
            if self._signals is not None and self._signals.gen == gen:
                return "text" in self._signals.expected and "text" not in self._signals.values
            return self.can_probe_text and self._answered == gen and \
                (self._early_text is None or self._early_text[0] != gen)

    def add_text(self, gen: int, p_text: float | None, words_logprob: float | None = None,
                 last_word: LastWord | None = None) -> None:
        """The text signal, with Whisper's confidence in the words it read (avg log-probability) and
        their last word's timing against the voice. Before turn ``gen``'s pause is judged it is
        kept for that pause."""
        with self._lock:
            if self._signals is None or self._signals.gen != gen:
                if self._answered == gen:
                    self._early_text = (gen, p_text, words_logprob, last_word)
                return
            self._signals.words_logprob, self._signals.last_word = words_logprob, last_word
        self._add(gen, "text", p_text)

    def _add(self, gen: int, kind: str, value: float | None) -> None:
        with self._lock:
            signals = self._signals
            if signals is None or signals.gen != gen or self._verdict is not None:
                return  # a pause that is over (the user went on) or already decided
            signals.add(kind, value)
            self._verdict = signals.verdict(self._endpointing)
            decided = self._verdict is not None
        if decided:
            self.wake(gen)

    def verdict(self, gen: int) -> Verdict | None:
        with self._lock:
            return self._verdict if self._verdict is not None and self._verdict.gen == gen else None

    def end_silence_ms(self, gen: int, endpointing: Endpointing) -> int:
        """The silence that ends turn ``gen`` as known now (see decision.end_silence_ms)."""
        return end_silence_ms(endpointing, self.verdict(gen))

    def forget(self) -> None:
        """The user went on after the pause: its signals no longer describe the turn."""
        with self._lock:
            self._signals, self._verdict, self._answered, self._early_text = None, None, None, None

    def close(self) -> None:
        if self.scorer is not None:
            self.scorer.close()
