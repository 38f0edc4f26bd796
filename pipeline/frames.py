"""The frames that move through the pipeline, one way, each carrying its turn's ``gen``.

``gen`` is the turn number: a new user turn or an interruption makes a new one, and
every stage drops data frames older than the newest ``Interrupt`` it has seen.

System frames (``SystemFrame``) are handled at once by every stage, overtaking queued data;
data frames are processed in order. Frames marked *out* reach the front end.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np


@dataclass
class Frame:
    """Anything that moves through the pipeline; ``gen`` is the turn it belongs to."""

    gen: int


@dataclass
class SystemFrame(Frame):
    """Handled at once, never queued behind data."""


# --- system frames -------------------------------------------------------------------------

@dataclass
class Interrupt(SystemFrame):
    """*out* Drop everything older than ``gen``: stop playback, cancel the answer."""

    # "barge-in" | "resume" (the user went on after a pause) | "user" | "text" | "notice" (the app speaks
    # instead) | "timeout" (the server ended a stalled turn)
    reason: str = "barge-in"
    resumes_gen: int = 0  # for "resume": the gen the utterance had until now


@dataclass
class PlaybackPause(SystemFrame):
    """*out* Possible speech has started over the assistant: pause playback now (within one VAD
    frame). Followed by ``Interrupt`` if the speech lasts, or ``PlaybackResume`` if it was a blip."""

    at_sample: int = 0  # 16 kHz input sample where the speech began


@dataclass
class PlaybackResume(SystemFrame):
    """*out* The sound that paused playback was a blip (a cough): carry on."""


@dataclass
class SpeechStarted(SystemFrame):
    """*out* The user is speaking (confirmed: longer than the persona's min_speech_ms); opens turn ``gen``.

    ``is_continuation``: the user spoke again after a pause, so the speculative answer to the
    words before the pause was dropped (``Interrupt(reason="resume")``) and the same utterance
    goes on under this new ``gen``."""

    at_sample: int = 0
    is_continuation: bool = False


@dataclass
class SpeechEnded(SystemFrame):
    """*out* End of the user's turn (the persona's silence_ms of silence). It *commits* turn
    ``gen``: the answer, prepared speculatively since the pause, may now be played.
    ``at_sample``: last voiced input sample (16 kHz clock)."""

    at_sample: int = 0
    t_speech_end: float = 0.0  # when the last voiced frame was pushed (monotonic)


@dataclass
class TurnJudged(SystemFrame):
    """*out* At a pause (persona endpointing mode "semantic"): what the voice and the words say
    about turn ``gen``. ``is_complete``: the turn ends after ``end_silence_ms`` of silence (counted
    from the last voiced frame) unless the user goes on; otherwise it waits up to that long.
    Probabilities are None when that signal is unavailable."""

    p_audio: float | None = None  # Smart Turn's P(complete) from the voice
    p_text: float | None = None  # the LLM's P(sentence ends here) after the words, punctuation stripped
    p_complete: float | None = None  # the two fused
    is_complete: bool = False
    end_silence_ms: int = 0


# --- data frames ---------------------------------------------------------------------------

@dataclass
class AudioIn(Frame):
    """16 kHz mono float32 input, already resampled at the edge. ``t`` is when it was pushed."""

    samples: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    t: float = 0.0


@dataclass
class UserAudio(Frame):
    """The audio of user turn ``gen``, VAD → ASR. ``is_speech`` per 32 ms frame."""

    samples: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    is_speech: bool = True


@dataclass
class SpeechPaused(Frame):
    """VAD → ASR: pause_ms of silence inside the turn. ASR transcribes now and the answer starts
    speculatively; it is only played once ``SpeechEnded`` commits the turn."""


@dataclass
class EndpointTick(Frame):
    """Endpointer → VAD stage: the end-of-turn signals of turn ``gen``'s pause are in; apply the
    verdict now instead of at the next audio frame."""


@dataclass
class TurnAudioEnd(Frame):
    """VAD → ASR: no more audio for turn ``gen`` (in order after its last UserAudio)."""


@dataclass
class TextIn(Frame):
    """A typed user turn (``Pipeline.text_input``)."""

    text: str = ""


@dataclass
class Transcript(Frame):
    """*out* What the user said: partials while speaking, one final at end of turn."""

    text: str = ""
    is_final: bool = False
    avg_logprob: float | None = None  # Whisper's confidence in its least sure segment (ASR finals)
    is_at_silence: bool = False  # a partial read at the first silent frame: the pause's final follows with these words


@dataclass
class TextDelta(Frame):
    """*out* A piece of the assistant's answer as the model writes it (for display)."""

    text: str = ""


@dataclass
class SpeakChunk(Frame):
    """*out* A speakable piece of the answer (cleaned), LLM → TTS, with the voice to use."""

    text: str = ""
    index: int = 0
    voice: Any = None  # pipeline.persona.Voice
    # Called by the TTS stage once this chunk's audio is made, or the chunk dropped: the LLM stage
    # holds the rest of the answer until then (LLMStageConfig.is_first_audio_first).
    on_synthesized: Callable[[], None] | None = None


@dataclass
class AudioOut(Frame):
    """*out* Assistant audio: mono int16 at ``sample_rate``. ``start_sample`` counts from the start
    of turn ``gen``'s audio; ``chunk_index`` names the SpeakChunk it voices."""

    pcm: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int16))
    sample_rate: int = 22050
    start_sample: int = 0
    chunk_index: int = 0
    text: str = ""


@dataclass
class AssistantDone(Frame):
    """*out* The model finished (or was cancelled); ``text`` is everything it wrote."""

    text: str = ""
    is_interrupted: bool = False
    num_tokens: int = 0


@dataclass
class TurnDone(Frame):
    """*out* The last frame of turn ``gen``: all its audio is out. ``waterfall`` is a dict of
    the turn's timings and counts (see pipeline.waterfall.TurnWaterfall)."""

    waterfall: dict = field(default_factory=dict)


@dataclass
class ErrorFrame(Frame):
    """*out* A stage failed on turn ``gen``; the turn ends here, the next one works. ``message`` is
    for the user (a server sends it to its client); ``detail`` (the exception) is for this
    machine's own logs and tools, never for a remote client."""

    stage: str = ""
    message: str = ""
    detail: str = ""
