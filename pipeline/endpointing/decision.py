"""The end-of-turn decision: the signals read at a pause, fused into P(turn complete), and how much
silence then ends the turn. Pure logic with an injected clock-free interface (the VAD stage feeds
it audio time), so tests script it frame by frame.

Signals, both read once per pause:
- ``audio``: Smart Turn's P(complete) from the voice. Fooled by fragments said with a falling
  voice ("What is the capital of" 0.5-0.9) and by some long requests.
- ``text``: the LLM's probability that the next token ends the sentence after the transcript
  with its trailing punctuation stripped (Whisper punctuates fragments, so the raw end-of-turn
  probability is fooled). Fragments score ~1e-4 and below, finished requests 0.01-0.9.

They are combined in log-odds: the text's odds relative to a pivot between those two ranges,
plus the audio's own log-odds times a weight. Either alone works when the other is missing (a
backend without probes, a pause with no words).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.persona import Endpointing

TEXT_PIVOT = 0.003  # sentence-end probability that counts as even odds (fragments <= 1e-4, requests >= 0.01)
AUDIO_WEIGHT = 0.7  # the voice's log-odds count this much next to the words'


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def fuse(p_audio: float | None, p_text: float | None) -> float | None:
    """P(turn complete) from whichever signals are present; None when there is none."""
    if p_audio is None and p_text is None:
        return None
    z = 0.0
    if p_text is not None:
        z += _logit(p_text) - _logit(TEXT_PIVOT)
    if p_audio is not None:
        z += (AUDIO_WEIGHT if p_text is not None else 1.0) * _logit(p_audio)
    return 1.0 / (1.0 + math.exp(-z))


@dataclass
class Verdict:
    """What was decided at one pause of turn ``gen``."""

    gen: int
    p_audio: float | None
    p_text: float | None
    p_complete: float | None
    is_complete: bool
    end_silence_ms: int  # the silence (from the last voiced frame) that ends the turn


class PauseSignals:
    """The signals of the latest pause of one session, as they arrive (any thread may ``add``).

    ``expects_text``: whether a text signal will come (the LLM backend can probe, and the pause has
    words); when it cannot, the audio alone decides."""

    def __init__(self, gen: int, expects_audio: bool, expects_text: bool):
        self.gen = gen
        self.expected = {kind for kind, on in (("audio", expects_audio), ("text", expects_text)) if on}
        self.values: dict[str, float | None] = {}

    def add(self, kind: str, value: float | None) -> None:
        self.values[kind] = value

    def give_up(self, kind: str) -> None:
        """That signal will not come (no words recognized, a failed probe)."""
        self.values.setdefault(kind, None)

    @property
    def is_ready(self) -> bool:
        return self.expected <= set(self.values)

    def verdict(self, endpointing: Endpointing) -> Verdict | None:
        """The decision once every expected signal arrived; None while one is pending."""
        if not self.is_ready:
            return None
        p_audio, p_text = self.values.get("audio"), self.values.get("text")
        p = fuse(p_audio, p_text)
        # No signal at all (no model, no words): nothing says it is finished, so wait the long silence.
        is_complete = p is not None and p >= endpointing.threshold
        wait = endpointing.short_silence_ms if is_complete else endpointing.long_silence_ms
        return Verdict(self.gen, p_audio, p_text, p, is_complete, wait)


def end_silence_ms(endpointing: Endpointing, verdict: Verdict | None) -> int:
    """Silence after which the turn ends, as known now: the persona's fixed silence in "silence"
    mode; in "semantic" mode the verdict's, or the long maximum while the signals are pending."""
    if endpointing.mode == "silence":
        return endpointing.silence_ms
    return verdict.end_silence_ms if verdict is not None else endpointing.long_silence_ms


def strip_trailing_punctuation(text: str) -> str:
    """The transcript as the text signal reads it: Whisper's final ".", "?", "..." removed."""
    return text.rstrip().rstrip(".?!,;:…-–— ").rstrip()
