"""One session's end-of-turn bookkeeping between the threads that feed it.

The VAD stage says when the answer to a turn's words starts (``on_answer``, a short pause), then
opens the judging pause (``on_pause``: the audio signal starts on the scorer's thread) and asks,
frame by frame, how much silence ends the turn (``end_silence_ms``). The LLM stage adds the text
signal once ASR's final is in (``add_text``): usually before the judging pause, since the answer
starts earlier; it is kept for that pause of the same turn. The ASR stage adds the final's last word
against the voice (``add_last_word``) once it has timed it, after sending the final (the answer does
not wait for that alignment pass); the verdict waits for it until ``LAST_WORD_DEADLINE_MS`` of
silence (``on_silence``, from the VAD stage), then decides without it. When the last expected
signal arrives, ``wake(gen)`` asks the VAD stage to apply the verdict at once rather than at its
next audio frame.
"""
from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from pipeline.endpointing.audio_signal import AudioTurnScorer
from pipeline.endpointing.decision import PauseSignals, Verdict, end_silence_ms
from pipeline.endpointing.last_word import LastWord
from pipeline.persona.persona import Endpointing

# The silence (from the last voiced frame) after which the verdict no longer waits for the last
# word's timing: the judging pause (192 ms) and as much again. It is usually in before the voice's
# score (the alignment pass is ~12 ms quiet, ~40 ms at load 5, right after the final at ~96-250 ms).
LAST_WORD_DEADLINE_MS = 384


class Endpointer:
    """Thread-safe; ``scorer`` (Smart Turn) may be None, and so may the text signal (``can_probe_text``:
    the LLM backend offers ``probe_sentence_end``). ``times_last_word``: an ASR stage will report each
    final's last word (``add_last_word``)."""

    def __init__(self, scorer: AudioTurnScorer | None, can_probe_text: bool, wake: Callable[[int], None],
                 times_last_word: bool = False):
        self.scorer = scorer
        self.can_probe_text = can_probe_text
        self.wake = wake
        self.times_last_word = times_last_word
        self._lock = threading.Lock()
        self._signals: PauseSignals | None = None
        self._endpointing = Endpointing()
        self._verdict: Verdict | None = None
        self._answered: int | None = None  # the turn whose answer started (its signals may come early)
        self._early_text: tuple[int, float | None, float | None] | None = None  # (gen, p_text, words_logprob)
        self._early_last_word: tuple[int, LastWord | None] | None = None  # (gen, last word)

    def on_answer(self, gen: int) -> None:
        """The answer to turn ``gen``'s words starts, before its pause is judged (semantic mode)."""
        with self._lock:
            self._answered, self._early_text, self._early_last_word = gen, None, None

    def on_pause(self, gen: int, audio: np.ndarray, endpointing: Endpointing) -> None:
        """A pause in turn ``gen`` (semantic mode): read the signals of the words so far."""
        with self._lock:
            expects_last_word = self.times_last_word and self.can_probe_text and endpointing.is_last_word_checked
            self._signals = PauseSignals(gen, self.scorer is not None, self.can_probe_text, expects_last_word)
            self._endpointing, self._verdict = endpointing, None
            early, self._early_text = self._early_text, None
            if early is not None and early[0] == gen:  # the words were probed as the answer started
                self._signals.add("text", early[1])
                self._signals.words_logprob = early[2]
            early_word, self._early_last_word = self._early_last_word, None
            if early_word is not None and early_word[0] == gen:  # ... and their last word timed
                self._signals.add_last_word(early_word[1])
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

    def add_text(self, gen: int, p_text: float | None, words_logprob: float | None = None) -> None:
        """The text signal, with Whisper's confidence in the words it read (avg log-probability).
        Before turn ``gen``'s pause is judged it is kept for that pause."""
        with self._lock:
            if self._signals is None or self._signals.gen != gen:
                if self._answered == gen:
                    self._early_text = (gen, p_text, words_logprob)
                return
            self._signals.words_logprob = words_logprob
        self._add(gen, "text", p_text)

    def add_last_word(self, gen: int, last_word: LastWord | None) -> None:
        """The last word of turn ``gen``'s final against the voice (None: not timed), sent by the ASR
        stage after the final itself. Before the pause is judged it is kept for that pause; after
        the verdict it changes nothing."""
        with self._lock:
            if self._signals is None or self._signals.gen != gen:
                if self._answered == gen:
                    self._early_last_word = (gen, last_word)
                return
        self._update(gen, lambda signals: signals.add_last_word(last_word))

    def on_silence(self, gen: int, silent_ms: int) -> bool:
        """The silence in turn ``gen`` so far (the VAD stage, each silent frame). Past
        ``LAST_WORD_DEADLINE_MS`` the verdict stops waiting for the last word. Returns whether that
        made the verdict (the caller applies it at once). (``_update`` skips a pause that is over or
        decided, ``miss_last_word`` one whose word came or is not expected.)"""
        if silent_ms < LAST_WORD_DEADLINE_MS:
            return False
        return self._update(gen, PauseSignals.miss_last_word, wake=False)

    def _add(self, gen: int, kind: str, value: float | None) -> None:
        self._update(gen, lambda signals: signals.add(kind, value))

    def _update(self, gen: int, change: Callable[[PauseSignals], None], wake: bool = True) -> bool:
        """Applies ``change`` to the open pause's signals; True when that made the verdict."""
        with self._lock:
            signals = self._signals
            if signals is None or signals.gen != gen or self._verdict is not None:
                return False  # a pause that is over (the user went on) or already decided
            change(signals)
            self._verdict = signals.verdict(self._endpointing)
            decided = self._verdict is not None
        if decided and wake:
            self.wake(gen)
        return decided

    def verdict(self, gen: int) -> Verdict | None:
        with self._lock:
            return self._verdict if self._verdict is not None and self._verdict.gen == gen else None

    def end_silence_ms(self, gen: int, endpointing: Endpointing) -> int:
        """The silence that ends turn ``gen`` as known now (see decision.end_silence_ms)."""
        return end_silence_ms(endpointing, self.verdict(gen))

    def forget(self) -> None:
        """The user went on after the pause: its signals no longer describe the turn."""
        with self._lock:
            self._signals, self._verdict, self._answered = None, None, None
            self._early_text, self._early_last_word = None, None

    def close(self) -> None:
        if self.scorer is not None:
            self.scorer.close()
