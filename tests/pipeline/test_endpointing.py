"""The end-of-turn decision on scripted signals, in audio time: the VAD stage driven frame by
frame with scripted speech probabilities, the signals delivered at chosen frames (no models, no
threads, no wall clock)."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.config import VADConfig
from pipeline.endpointing.decision import fuse, strip_trailing_punctuation
from pipeline.endpointing.endpointer import Endpointer
from pipeline.frames import AudioIn, Interrupt, SpeechEnded, SpeechStarted, TurnJudged
from pipeline.turns import TurnCounter
from pipeline.persona.persona import Endpointing
from pipeline.schema import SchemaError, build
from pipeline.vad.turn_detector import FRAME_MS
from pipeline.vad.silero import FRAME_SAMPLES
from pipeline.vad.stage import VADStage
from pipeline.waterfall import WaterfallBook

SEMANTIC = Endpointing(mode="semantic", short_silence_ms=192, long_silence_ms=1600, threshold=0.5, min_speech_ms=256)
PAUSE_MS = 96


class ScriptedVAD:
    """Stands in for Silero: the next speech probability of a script, per 32 ms frame."""

    def __init__(self):
        self.probs: list[float] = []

    def __call__(self, frame: np.ndarray) -> float:
        return self.probs.pop(0)


class Harness:
    """A VAD stage with an endpointer whose text signal the test delivers by hand (no audio model)."""

    def __init__(self, endpointing: Endpointing, config: VADConfig = VADConfig(pause_ms=PAUSE_MS)):
        self.vad = ScriptedVAD()
        self.ticks: list[int] = []
        self.endpointer = Endpointer(None, can_probe_text=True, wake=self.ticks.append)
        self.stage = VADStage(self.vad, config, TurnCounter(), lambda: endpointing,
                              WaterfallBook(), endpointer=self.endpointer)
        self.frames: list[tuple[int, object]] = []  # (frame index, output frame)
        self.index = 0

    def feed(self, prob: float, count: int = 1) -> None:
        for _ in range(count):
            self.vad.probs.append(prob)
            for out in self.stage.process(AudioIn(gen=0, samples=np.zeros(FRAME_SAMPLES, np.float32))):
                self.frames.append((self.index, out))
            self.index += 1

    def text_signal(self, p_text: float, words_logprob: float = -0.1) -> None:
        """The LLM stage's probe result arrives; the wake-up tick is processed like the stage would."""
        gen = self.stage._turn_gen
        assert self.endpointer.wants_text(gen)
        self.endpointer.add_text(gen, p_text, words_logprob)
        for gen in self.ticks:
            for out in self.stage.process(_tick(gen)):
                self.frames.append((self.index, out))
        self.ticks.clear()

    def of(self, kind) -> list[tuple[int, object]]:
        return [(i, f) for i, f in self.frames if isinstance(f, kind)]


def _tick(gen: int):
    from pipeline.frames import EndpointTick

    return EndpointTick(gen=gen)


def frames(ms: int) -> int:
    return ms // FRAME_MS


def speak_then_pause(h: Harness, speech_ms: int = 1000) -> int:
    """Speech, then silence up to the pause; returns the index of the last voiced frame."""
    h.feed(0.0, 3)
    h.feed(0.9, frames(speech_ms))
    last_voiced = h.index - 1
    h.feed(0.0, frames(PAUSE_MS))
    return last_voiced


def test_fusion_lets_the_words_overrule_a_fooled_voice_and_the_voice_rescue_a_missed_request():
    assert fuse(p_audio=0.92, p_text=1e-4) < 0.5  # "What is the capital of": the voice says done, the words not
    assert fuse(p_audio=0.15, p_text=0.45) > 0.5  # a long request the voice missed
    assert fuse(p_audio=0.95, p_text=0.02) > 0.5  # "Tell me a joke": a low but real sentence end
    assert fuse(p_audio=0.03, p_text=None) == pytest.approx(0.03)  # the voice alone
    assert fuse(None, 1e-5) < 0.5 < fuse(None, 0.05)  # the words alone
    assert fuse(None, None) is None


def test_words_whisper_was_unsure_of_cannot_say_the_sentence_is_finished():
    # "What is the weather like in the rain?" (a misheard "What is the weather like in ..."): avg log-prob -0.75
    assert fuse(p_audio=0.8, p_text=0.5, words_logprob=-0.75) < 0.5
    assert fuse(p_audio=0.8, p_text=0.5, words_logprob=-0.2) > 0.5


def test_a_sentence_joined_across_a_pause_is_as_sure_as_its_words():
    from pipeline.asr.stage import joined_confidence

    # "What is the capital of" heard surely, "Spain" (read alone after the pause) less so: the
    # sentence stays trusted, and a misheard head still counts against it.
    assert joined_confidence("What is the capital of?", -0.2, "Spain.", -0.8) == pytest.approx(-0.3)
    assert joined_confidence("What is the weather like in?", -0.9, "Paris.", -0.1) < -0.6
    assert joined_confidence("Remind me to", None, "buy milk.", -0.3) == -0.3


def test_the_text_signal_reads_the_words_without_whispers_final_punctuation():
    assert strip_trailing_punctuation("What is the capital of?") == "What is the capital of"
    assert strip_trailing_punctuation("Remind me to...  ") == "Remind me to"
    assert strip_trailing_punctuation("Is 3.5 more than 3?") == "Is 3.5 more than 3"


def test_a_finished_sentence_ends_the_turn_after_the_short_silence():
    h = Harness(SEMANTIC)
    last_voiced = speak_then_pause(h)
    h.text_signal(0.4)
    [(_, judged)] = [(i, f) for i, f in h.of(TurnJudged)]
    assert judged.is_complete and judged.end_silence_ms == 192 and judged.p_text == 0.4
    assert not h.of(SpeechEnded)  # 96 ms of silence so far: not yet
    h.feed(0.0, frames(400))
    [(end, _)] = h.of(SpeechEnded)
    assert end - last_voiced == frames(192)


def test_a_verdict_that_arrives_after_the_short_silence_ends_the_turn_at_once():
    h = Harness(SEMANTIC)
    last_voiced = speak_then_pause(h)
    h.feed(0.0, frames(320))  # the signals are slow (a busy machine): 416 ms of silence already
    assert not h.of(SpeechEnded)
    h.text_signal(0.4)
    [(end, _)] = h.of(SpeechEnded)
    assert end == h.index  # applied by the tick, before the next audio frame
    assert end - last_voiced > frames(192)


def test_an_unfinished_sentence_waits_through_a_long_pause_and_stays_one_turn():
    h = Harness(SEMANTIC)
    speak_then_pause(h)
    h.text_signal(1e-5)
    [(_, judged)] = h.of(TurnJudged)
    assert not judged.is_complete and judged.end_silence_ms == 1600
    h.feed(0.0, frames(1000))  # a thinking pause of ~1.1 s in all
    assert not h.of(SpeechEnded)
    h.feed(0.9, frames(800))  # "... Spain?"
    resumed = [f for _, f in h.of(Interrupt) if f.reason == "resume"]
    continued = [f for _, f in h.of(SpeechStarted) if f.is_continuation]
    assert len(resumed) == len(continued) == 1
    last_voiced = h.index - 1
    h.feed(0.0, frames(PAUSE_MS))
    h.text_signal(0.6)  # the whole question now reads finished
    h.feed(0.0, frames(400))
    [(end, ended)] = h.of(SpeechEnded)
    assert ended.gen == continued[0].gen and end - last_voiced == frames(192)


def test_an_unfinished_sentence_ends_anyway_after_the_long_silence():
    h = Harness(SEMANTIC)
    last_voiced = speak_then_pause(h)
    h.text_signal(1e-5)
    h.feed(0.0, frames(2000))
    [(end, _)] = h.of(SpeechEnded)
    assert end - last_voiced == frames(1600)


def answer_before_judging() -> tuple[Harness, int]:
    """The answer starts at a 96 ms pause, the signals are read at 192 ms: speech, then 96 ms of
    silence; returns the harness and the index of the last voiced frame."""
    h = Harness(SEMANTIC, VADConfig(pause_ms=192, answer_pause_ms=96))
    h.feed(0.0, 3)
    h.feed(0.9, frames(1000))
    last_voiced = h.index - 1
    h.feed(0.0, frames(96))
    return h, last_voiced


def test_words_probed_as_the_answer_starts_count_when_the_longer_pause_is_judged():
    from pipeline.frames import SpeechPaused

    h, last_voiced = answer_before_judging()
    [(paused, _)] = h.of(SpeechPaused)  # the answer starts: ASR's final, then the probe of its words
    assert paused - last_voiced == frames(96)
    h.text_signal(0.4)  # before the judging pause: kept for it, nothing decided yet
    assert not h.of(TurnJudged) and not h.endpointer.wants_text(h.stage._turn_gen)
    h.feed(0.0, frames(96))
    [(judged_at, judged)] = h.of(TurnJudged)
    assert judged_at - last_voiced == frames(192) and judged.p_text == 0.4 and judged.is_complete
    h.feed(0.0, frames(400))
    [(end, _)] = h.of(SpeechEnded)
    assert end - last_voiced == frames(192)


def test_words_going_on_after_the_answer_started_are_probed_again():
    h, _ = answer_before_judging()
    h.text_signal(0.4)  # "What is the capital": the probe of the first answer's words
    h.feed(0.9, frames(500))  # "... of Spain?" before the pause was judged
    [(_, resumed)] = [(i, f) for i, f in h.of(Interrupt) if f.reason == "resume"]
    assert not h.endpointer.wants_text(resumed.gen)  # not before its own answer starts
    h.feed(0.0, frames(96))
    assert h.endpointer.wants_text(resumed.gen)  # the old words' probe is not this turn's
    h.text_signal(1e-5)
    h.feed(0.0, frames(96))
    [(_, judged)] = h.of(TurnJudged)
    assert judged.gen == resumed.gen and judged.p_text == 1e-5 and not judged.is_complete


def test_silence_mode_ends_after_silence_ms_whatever_the_signals_say():
    h = Harness(Endpointing(mode="silence", silence_ms=480, min_speech_ms=256))
    last_voiced = speak_then_pause(h)
    assert not h.endpointer.wants_text(h.stage._turn_gen)  # nothing is read at the pause
    h.feed(0.0, frames(1000))
    [(end, _)] = h.of(SpeechEnded)
    assert end - last_voiced == frames(480) and not h.of(TurnJudged)


def test_endpointing_settings_are_validated():
    with pytest.raises(SchemaError, match="mode"):
        build(Endpointing, {"mode": "psychic"}, "p.toml")
    with pytest.raises(SchemaError, match="long_silence_ms"):
        build(Endpointing, {"short_silence_ms": 800, "long_silence_ms": 400}, "p.toml")
    with pytest.raises(SchemaError, match="threshold"):
        build(Endpointing, {"threshold": 1.5}, "p.toml")


class ProbingBackend:
    """A FakeBackend with our engine's probe: records the order of probes and answers."""

    def __init__(self):
        from tests.pipeline.fakes import FakeBackend

        self.fake, self.log = FakeBackend(["Madrid."]), []
        self.count_tokens, self.context_length = self.fake.count_tokens, self.fake.context_length

    def prefill(self, messages, session=None, probe_ids=None):
        self.log.append(("prefill", messages[-1]["content"]))

    def probe_sentence_end(self, messages, session=None):
        self.log.append(("probe", messages[-1]["content"]))
        return 0.6 if messages[-1]["content"].endswith("Spain") else 0.001  # a fragment's words end no sentence

    def generate(self, messages, sampling, session=None):
        self.log.append(("answer", messages[-1]["content"]))
        return self.fake.generate(messages, sampling, session)


def probed_turn(partial: str, final: str, mode: str = "semantic") -> tuple[list, Endpointer]:
    """A partial, the pause, then the final through a bare LLM stage (frames processed in order)."""
    import dataclasses

    from pipeline.config import ChunkerConfig, LLMStageConfig
    from pipeline.frames import Transcript
    from pipeline.llm.history import History
    from pipeline.llm.stage import LLMStage
    from pipeline.persona.store import PersonaStore

    nova = PersonaStore().get("nova")
    persona = dataclasses.replace(nova, endpointing=dataclasses.replace(SEMANTIC, mode=mode))
    backend, endpointer = ProbingBackend(), Endpointer(None, can_probe_text=True, wake=lambda gen: None)
    stage = LLMStage(backend, lambda: persona, History(), LLMStageConfig(is_prewarm_enabled=False), ChunkerConfig(),
                     WaterfallBook(), session="probe-talk", endpointer=endpointer)
    list(stage.process(Transcript(gen=1, text=partial, is_final=False)))
    if mode == "semantic":  # as the VAD stage does
        endpointer.on_pause(1, np.zeros(16000, np.float32), persona.endpointing)
    list(stage.process(Transcript(gen=1, text=final, is_final=True, avg_logprob=-0.1)))
    return backend.log, endpointer


def test_the_last_partials_probe_is_the_finals_and_the_answer_starts_at_once():
    log, endpointer = probed_turn("What is the capital of Spain?", "What is the capital of Spain?")
    assert log == [("probe", "What is the capital of Spain"), ("answer", "What is the capital of Spain?")]
    assert endpointer.verdict(1) is not None and endpointer.verdict(1).p_text == 0.6
    # other words at the final: probed again, before the answer
    log, _ = probed_turn("What is the capital", "What is the capital of Spain?")
    assert log == [("probe", "What is the capital"), ("probe", "What is the capital of Spain"),
                   ("answer", "What is the capital of Spain?")]
    log, _ = probed_turn("What is the capital of Spain?", "What is the capital of Spain?", mode="silence")
    assert log == [("prefill", "What is the capital of Spain?"), ("answer", "What is the capital of Spain?")]
