"""The end-of-turn decision: the signals read at a pause, fused into P(turn complete), and how much
silence then ends the turn. Pure logic, no clock (silences are audio time the VAD stage counts
frame by frame), so tests script it.

Signals, both read once per pause:
- ``audio``: Smart Turn's P(complete) from the voice. Fooled by fragments said with a falling
  voice ("What is the capital of" 0.5-0.9) and by some long requests.
- ``text``: the LLM's probability that the next token ends the sentence after the transcript
  with its trailing punctuation stripped (Whisper punctuates fragments, so the raw end-of-turn
  probability is fooled). Fragments score ~1e-4 and below, finished requests 0.01-0.9.

They are combined in log-odds: the text's odds relative to a pivot, plus the audio's own
log-odds times a weight. Either alone works when the other is missing (a backend without
probes, a pause with no words).

Calibrated on ``voxlane bench turns``'s set (24 fragments cut from requests at a thinking pause,
24 requests; Piper, espeak-ng and flite voices; SmolLM2-135M): correctly heard fragments scored
text <= 0.007, requests 0.13-0.95 ("Tell me a joke", not in the set, 0.010-0.026). The four
fragments above 0.02 were misheard by Whisper into other sentences ("What is the weather like in
the rain?"). The voice alone called 19 of the 24 fragments complete (synthetic voices end a cut
phrase as a sentence), so it gets a small weight: it tips a borderline text, never a clear one.
Misheard words are the text signal's weak spot; Whisper knows when it is unsure: its average
log-probability was -0.51 to -0.99 on the four misheard fragments, -0.04 to -0.58 on every
request. Below ``UNSURE_WORDS_LOGPROB`` the words cannot say "finished": the text counts as
doubtful (``DOUBTFUL_TEXT``), and the turn waits unless the voice is very sure. (Chosen on that
same set: three of the four misheard fragments fall below it; a held-out set should confirm it.)

Whisper also completes fragments with sure-sounding words: "What should I cook for" + a pause is
read "What should I cook for her?" (-0.33), and the text then rightly reads finished. The last
word's timing against the voice (``last_word.is_doubtful``: invented words lie after the voice,
misheard function words come out as unsure pronouns) makes such words doubtful too. That timing
is a signal of its own: ASR sends the final's words first (the answer starts from them) and times
the last word after (an alignment pass); the verdict waits for it up to a deadline, then decides
without it (``PauseSignals.miss_last_word``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.endpointing.last_word import LastWord, is_doubtful
from pipeline.persona.persona import Endpointing

TEXT_PIVOT = 0.02  # sentence-end probability that counts as even odds (calibration above)
AUDIO_WEIGHT = 0.3  # the voice's log-odds count this much next to the words'
UNSURE_WORDS_LOGPROB = -0.6  # Whisper's avg log-probability below which the words are not trusted
DOUBTFUL_TEXT = 0.002  # what unsure words count as at most (10x below the pivot)


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def fuse(p_audio: float | None, p_text: float | None, words_logprob: float | None = None,
         last_word: LastWord | None = None) -> float | None:
    """P(turn complete) from whichever signals are present; None when there is none.
    ``words_logprob``: Whisper's confidence in the words the text signal read; ``last_word``: their
    last word against the voice (None: not timed, or not to be checked)."""
    if p_audio is None and p_text is None:
        return None
    is_unsure = words_logprob is not None and words_logprob < UNSURE_WORDS_LOGPROB
    if p_text is not None and (is_unsure or is_doubtful(last_word)):
        p_text = min(p_text, DOUBTFUL_TEXT)
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
    is_last_word_late: bool = False  # decided without the last word's timing: it missed its deadline


class PauseSignals:
    """The signals of the latest pause of one session, as they arrive (any thread may ``add``).

    ``expects_text``: whether a text signal will come (the LLM backend can probe, and the pause has
    words); when it cannot, the audio alone decides. ``expects_last_word``: whether the words' last
    word will be timed (``add_last_word``, after the words themselves) and checked; the verdict
    waits for it unless ``miss_last_word`` says its deadline passed."""

    def __init__(self, gen: int, expects_audio: bool, expects_text: bool, expects_last_word: bool = False):
        self.gen = gen
        self.expected = {kind for kind, on in (("audio", expects_audio), ("text", expects_text),
                                               ("last_word", expects_last_word)) if on}
        self.values: dict[str, float | None] = {}  # "last_word": None once it arrived (the word is ``last_word``)
        self.words_logprob: float | None = None  # Whisper's confidence in the words of the text signal
        self.last_word: LastWord | None = None  # their last word against the voice
        self.is_last_word_late = False

    def add(self, kind: str, value: float | None) -> None:
        self.values[kind] = value

    def give_up(self, kind: str) -> None:
        """That signal will not come (no words recognized, a failed probe)."""
        self.values.setdefault(kind, None)

    def add_last_word(self, last_word: LastWord | None) -> None:
        """The words' last word against the voice (None: it was not timed). Still taken after its
        deadline if the verdict waits for another signal."""
        self.last_word, self.is_last_word_late = last_word, False
        self.values["last_word"] = None

    def miss_last_word(self) -> None:
        """Its deadline passed: decide without it, as when it is not timed."""
        if "last_word" in self.expected and "last_word" not in self.values:
            self.is_last_word_late = True
            self.values["last_word"] = None

    @property
    def is_ready(self) -> bool:
        return self.expected <= set(self.values)

    def verdict(self, endpointing: Endpointing) -> Verdict | None:
        """The decision once every expected signal arrived; None while one is pending."""
        if not self.is_ready:
            return None
        p_audio, p_text = self.values.get("audio"), self.values.get("text")
        last_word = self.last_word if endpointing.is_last_word_checked else None
        p = fuse(p_audio, p_text, self.words_logprob, last_word)
        # No signal at all (no model, no words): nothing says it is finished, so wait the long silence.
        is_complete = p is not None and p >= endpointing.threshold
        wait = endpointing.short_silence_ms if is_complete else endpointing.long_silence_ms
        return Verdict(self.gen, p_audio, p_text, p, is_complete, wait, self.is_last_word_late)


def end_silence_ms(endpointing: Endpointing, verdict: Verdict | None) -> int:
    """Silence after which the turn ends, as known now: the persona's fixed silence in "silence"
    mode; in "semantic" mode the verdict's, or the long maximum while the signals are pending."""
    if endpointing.mode == "silence":
        return endpointing.silence_ms
    return verdict.end_silence_ms if verdict is not None else endpointing.long_silence_ms


def strip_trailing_punctuation(text: str) -> str:
    """The transcript as the text signal reads it: Whisper's final ".", "?", "..." removed."""
    return text.rstrip().rstrip(".?!,;:…-–— ").rstrip()
