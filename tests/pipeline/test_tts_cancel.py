"""Cancelling speech mid-call: Piper's ONNX run is terminated mid-sentence, a command TTS's
process is killed, and the TTS stage cancels the synthesis in flight on an interruption, emits no
audio of the old turn after it, and speaks the next turn at once."""
from __future__ import annotations

import queue
import threading

import numpy as np
import pytest

from pipeline.frames import AssistantDone, AudioOut, Interrupt, SpeakChunk, TurnDone
from pipeline.persona.persona import Voice
from pipeline.tts import Cancel
from pipeline.tts.command_tts import CommandTTS
from pipeline.tts.stage import TTSStage
from pipeline.waterfall import WaterfallBook

# Four long sentences: each is one ONNX run of a second or more on this machine.
LONG = " ".join(["The quick brown fox jumps over the lazy dog while the farmer watches from the old red barn,"
                 " and the children laugh in the garden behind the house."] * 4)


class WatchedSession:
    """Piper's ONNX session with a record of every run: "completed" or "terminated"."""

    def __init__(self, session):
        self.session = session
        self.outcomes: list[str] = []
        self.num_started = 0
        self.second_run_started = threading.Event()

    def run(self, names, inputs, options=None):
        self.num_started += 1
        if self.num_started == 2:
            self.second_run_started.set()
        try:
            result = self.session.run(names, inputs, options)
        except Exception:
            self.outcomes.append("terminated")
            raise
        self.outcomes.append("completed")
        return result


@pytest.fixture
def watched_piper(piper_voice_path):
    from pipeline.tts.piper_tts import PiperTTS

    tts = PiperTTS(piper_voice_path)  # its own voice: the shared one is not instrumented
    tts.voice.session = WatchedSession(tts.voice.session)
    return tts


def test_cancel_calls_back_once_and_at_once_when_already_cancelled():
    cancel, calls = Cancel(), []
    cancel.on_cancel(lambda: calls.append("a"))
    cancel.cancel()
    cancel.cancel()
    cancel.on_cancel(lambda: calls.append("b"))
    assert calls == ["a", "b"] and cancel.is_cancelled


def test_piper_stops_mid_sentence(watched_piper):
    cancel, chunks = Cancel(), []
    worker = threading.Thread(target=lambda: chunks.extend(watched_piper.synthesize(LONG, cancel=cancel)))
    worker.start()
    assert watched_piper.voice.session.second_run_started.wait(60)
    cancel.cancel()
    worker.join(timeout=30)
    assert not worker.is_alive()
    # The first sentence was made; the second was cut inside its run; no third was started.
    assert watched_piper.voice.session.outcomes == ["completed", "terminated"]
    assert len(chunks) == 1


@pytest.mark.parametrize("kind", ["flite", "espeak"])
def test_command_tts_kills_its_process(kind):
    tts = CommandTTS(kind)
    cancel = Cancel()
    cancel.cancel()  # already cancelled: the process is killed as soon as it starts
    assert list(tts.synthesize(LONG, cancel=cancel)) == []
    assert len(np.concatenate(list(tts.synthesize("Still speaking.")))) > 0  # the backend is fine after


def test_the_stage_cancels_on_interrupt_and_speaks_the_next_turn(watched_piper):
    out: queue.Queue = queue.Queue()
    stage = TTSStage(lambda voice: watched_piper, WaterfallBook())
    stage.connect(out.put)
    stage.start()
    try:
        stage.put(SpeakChunk(gen=1, index=0, text=LONG, voice=Voice()))
        stage.put(AssistantDone(gen=1, text=LONG))
        assert watched_piper.voice.session.second_run_started.wait(60)  # mid-utterance, a sentence in flight
        stage.put(Interrupt(gen=2, reason="user"))
        stage.put(SpeakChunk(gen=2, index=0, text="Yes?", voice=Voice()))
        stage.put(AssistantDone(gen=2, text="Yes?"))
        seen = []
        while not (seen and isinstance(seen[-1], TurnDone) and seen[-1].gen == 2):
            seen.append(out.get(timeout=60))
    finally:
        assert stage.stop()
    interrupt_at = next(i for i, f in enumerate(seen) if isinstance(f, Interrupt))
    old_audio = [i for i, f in enumerate(seen) if isinstance(f, AudioOut) and f.gen == 1]
    assert old_audio and max(old_audio) < interrupt_at  # nothing of the old turn after the interrupt
    assert not [f for f in seen if isinstance(f, TurnDone) and f.gen == 1]  # the old turn just stops
    assert any(isinstance(f, AudioOut) and f.gen == 2 for f in seen)  # the next turn is spoken
    # The sentence in flight was cut inside its run, and the rest of the utterance never started.
    assert watched_piper.voice.session.outcomes[:2] == ["completed", "terminated"]
    assert watched_piper.voice.session.num_started == 3  # two of the old turn, one for "Yes?"
