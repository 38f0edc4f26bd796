"""The pipeline on real audio with real VAD and ASR (scripted LLM, fake TTS for speed): no turn
from silence or noise, 48 kHz stereo input, a cough does not interrupt, and a speculative answer
is dropped unseen when the user goes on after a pause."""
from __future__ import annotations

import time

import numpy as np
import pytest

from app.scripted_user import speech_bounds
from bench.wer import wer
from pipeline.audio import resample_once
from pipeline.frames import (AudioOut, PlaybackPause, PlaybackResume, SpeakChunk, SpeechEnded, SpeechStarted,
                             TextDelta, Transcript, TurnDone)
from pipeline.persona.store import PersonaStore
from pipeline.pipeline import Pipeline
from tests.pipeline.fakes import FakeBackend, SilentTTS


@pytest.fixture
def voice_pipeline(transcriber, vad_model):
    backend = FakeBackend(["Sure, here is a scripted answer for you."])
    tts = SilentTTS()
    pipeline = Pipeline(llm=backend, tts=lambda voice: tts, personas=PersonaStore(), persona="nova",
                        transcriber=transcriber, vad_model=vad_model)
    pipeline.backend = backend  # for the tests' eyes only
    yield pipeline
    pipeline.close()


def push(pipeline: Pipeline, samples: np.ndarray, rate: int = 16000, channels: int = 1) -> None:
    """As a microphone would, in 20 ms pieces (not paced: the pipeline does not need real time)."""
    step = rate // 50 * channels
    for i in range(0, len(samples), step):
        pipeline.push_audio(samples[i:i + step], rate, channels)


def drain(pipeline: Pipeline, until=None, quiet_s: float = 1.5, timeout_s: float = 30.0) -> list:
    """Frames until ``until(frame)`` is true, or until nothing has come for ``quiet_s``."""
    frames, last = [], time.monotonic()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and time.monotonic() - last < quiet_s:
        frame = pipeline.next_frame(0.05)
        if frame is not None:
            frames.append(frame)
            last = time.monotonic()
            if until and until(frame):
                break
    return frames


def trimmed(audio: np.ndarray) -> np.ndarray:
    begin, end = speech_bounds(audio)
    return audio[begin:end]


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(16000 * seconds), np.float32)


@pytest.mark.parametrize("kind", ["silence", "noise"])
def test_no_turn_from_three_seconds_of_silence_or_noise(voice_pipeline, kind):
    rng = np.random.default_rng(3)
    audio = silence(3.0) if kind == "silence" else rng.normal(0, 0.05, 48000).astype(np.float32)
    push(voice_pipeline, np.concatenate([audio, silence(1.0)]))
    frames = drain(voice_pipeline)
    assert not [f for f in frames if isinstance(f, (SpeechStarted, Transcript, TurnDone))]
    assert voice_pipeline.backend.calls == []


def test_48k_stereo_input_is_resampled_once_at_the_edge(voice_pipeline, say):
    sentence = "How many legs does a spider have?"
    audio, _ = say(sentence, "flite")  # flite is deterministic (Piper adds random noise per run)
    audio48 = resample_once(np.concatenate([silence(0.3), audio, silence(1.2)]), 16000, 48000)
    stereo = np.stack([audio48, 0.8 * audio48], axis=1)  # (frames, 2), channels not identical
    pcm = (np.clip(stereo, -1, 1) * 32767).astype(np.int16).reshape(-1)  # interleaved
    voice_pipeline.interrupt()  # a stop button pressed earlier must not deafen the microphone
    push(voice_pipeline, pcm, 48000, 2)
    frames = drain(voice_pipeline, until=lambda f: isinstance(f, TurnDone))
    finals = [f.text for f in frames if isinstance(f, Transcript) and f.is_final]
    assert len(finals) == 1 and wer(sentence, finals[0]) == 0.0, finals
    assert any(isinstance(f, AudioOut) for f in frames)


def test_a_cough_pauses_playback_then_resumes_and_is_no_turn(voice_pipeline, say):
    audio, _ = say("Ha!")
    begin = int(np.argmax(np.abs(audio) > 0.05))
    blip = audio[begin:begin + 16000 * 150 // 1000]  # 150 ms of voice: shorter than min_speech_ms
    push(voice_pipeline, np.concatenate([silence(0.5), blip, silence(1.0)]))
    frames = drain(voice_pipeline)
    kinds = [type(f) for f in frames]
    assert PlaybackPause in kinds and PlaybackResume in kinds
    assert SpeechStarted not in kinds and voice_pipeline.backend.calls == []


def test_speech_after_a_pause_drops_the_speculative_answer(voice_pipeline, say):
    # pause of 300 ms: more than answer_pause_ms (96, the answer starts), less than silence_ms (500)
    first, second = (trimmed(say(text, "flite")[0]) for text in ("What is the capital", "of France?"))
    backend, completions = voice_pipeline.backend, []
    backend.delay_s = 0.2  # a word every 200 ms: the first answer is still being written when the user goes on
    generate = backend.generate
    backend.generate = lambda *args, **kwargs: completions.append(generate(*args, **kwargs)) or completions[-1]
    push(voice_pipeline, np.concatenate([silence(0.3), first, silence(0.3)]))
    deadline = time.monotonic() + 20
    while not completions and time.monotonic() < deadline:  # the answer to "What is the capital" starts
        time.sleep(0.01)
    assert completions, "no speculative answer started at the pause"
    push(voice_pipeline, np.concatenate([second, silence(1.2)]))
    frames = drain(voice_pipeline, until=lambda f: isinstance(f, TurnDone))
    started = [f for f in frames if isinstance(f, SpeechStarted)]
    assert len(started) == 2 and started[1].is_continuation  # the utterance went on under a new gen
    gen = started[1].gen
    # The answer to "What is the capital" was cancelled, freed its slot, and none of it was heard:
    assert len(completions) >= 2 and not completions[-1].cancelled.is_set()
    assert all(c.cancelled.is_set() for c in completions[:-1])
    assert backend.active == 0
    assert all(f.gen == gen for f in frames if isinstance(f, (AudioOut, SpeakChunk, TextDelta, TurnDone, SpeechEnded)))
    finals = [f.text for f in frames if isinstance(f, Transcript) and f.is_final]
    # Both halves in one final (flite spliced at a 300 ms gap reads as "capital of the France": 1 word)
    assert finals and wer("What is the capital of France?", finals[-1]) <= 0.2, finals
    assert [e.user for e in voice_pipeline.history] == [finals[-1]]
