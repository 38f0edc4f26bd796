"""Is there voice under the last word Whisper wrote? A signal for the end-of-turn decision.

Whisper completes fragments: "What should I cook for" + a pause is read "What should I cook for
her?", and the invented "her" makes a finished sentence the text probe rightly calls finished.
An invented word has no sound of its own: Whisper's cross-attention puts it at the very end of
the voice or in the silence after it, squeezed to a frame or two. So the ASR stage times the
last word of a read (an alignment pass over the same encoder output) and measures how much of
it lies over audio the VAD called voiced. Pure data and arithmetic: no model, no clock.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.audio import PIPELINE_RATE


@dataclass(frozen=True)
class LastWord:
    """The last word of a transcript and the voice under it, in ms of the buffer Whisper read."""

    word: str
    start_ms: float  # Whisper's timing of the word (20 ms steps)
    end_ms: float
    voiced_end_ms: float  # the end of the last frame the VAD called speech, same clock
    probability: float  # the word's mean token probability in the alignment pass

    @property
    def voiced_ms(self) -> float:
        """How much of the word lies over voiced audio: 0 when Whisper put it after the voice."""
        return max(0.0, min(self.end_ms, self.voiced_end_ms) - self.start_ms)


def timed_last_word(word: str, start_s: float, end_s: float, probability: float,
                    voiced_end_samples: int, rate: int = PIPELINE_RATE) -> LastWord:
    """A ``LastWord`` from Whisper's timing (seconds) and the voiced end (samples of the same buffer)."""
    return LastWord(word, round(1000 * start_s, 1), round(1000 * end_s, 1),
                    round(1000 * voiced_end_samples / rate, 1), round(probability, 3))


MIN_VOICED_SHARE = 0.5  # a last word less than half over voiced audio was not heard but invented ...
HEARD_MS = 200  # ... unless this much voice lies under it (Whisper may stretch a heard word, "puppy?.", into the silence)
UNSURE_PRONOUN_P = 0.6  # a final pronoun read with less than this is a misheard function word
PRONOUNS = frozenset({"it", "them", "her", "him", "this", "that"})  # what Whisper turns "for", "the", "a" into


def is_doubtful(last_word: LastWord | None) -> bool:
    """Whether the last word cannot be trusted to finish the sentence: it starts where the voice
    has ended, or lies mostly after it with little voice under it (invented: "What should I cook
    for | her?"), or it is an object pronoun Whisper was unsure of (a trailing "the" or "a" read as
    "them": "Who painted them?"). A word Whisper squeezed to no length inside the voice ("ocean"
    2040-2040 ms, the voice ending at 2176) is heard. How these rules were chosen, set by set:
    docs/pipeline.md ("Where it still cuts")."""
    if last_word is None:
        return False
    if last_word.start_ms >= last_word.voiced_end_ms:
        return True
    duration = last_word.end_ms - last_word.start_ms
    if last_word.voiced_ms < MIN_VOICED_SHARE * duration and last_word.voiced_ms < HEARD_MS:
        return True
    word = last_word.word.strip(".,?!;:…'\"").lower()
    return word in PRONOUNS and last_word.probability < UNSURE_PRONOUN_P
