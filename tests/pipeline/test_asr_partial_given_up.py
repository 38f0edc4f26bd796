"""A periodic partial is given up when a silent frame already waits behind it (real Whisper, real
speech): the read at that silence onset reads the same words and more, and a partial run to its end
held it up. Before Whisper's encoder when the silence is queued already, before its decoder when it
comes during the encoder."""
from __future__ import annotations

import numpy as np

from bench.wer import wer
from pipeline.asr.stage import ASRStage
from pipeline.config import ASRConfig
from pipeline.frames import Transcript, UserAudio
from pipeline.waterfall import WaterfallBook
from tests.pipeline.test_voice_pipeline import trimmed

FRAME = 512
SENTENCE = "How many legs does a spider have?"


class CountingModel:
    """The CTranslate2 Whisper model, counting encoder and decoder calls; ``on_encode`` runs after each
    encoder call (as if audio arrived meanwhile)."""

    def __init__(self, model):
        self._model, self.encodes, self.decodes, self.on_encode = model, 0, 0, lambda: None

    def encode(self, *args, **kwargs):
        self.encodes += 1
        out = self._model.encode(*args, **kwargs)
        self.on_encode()
        return out

    def generate(self, *args, **kwargs):
        self.decodes += 1
        return self._model.generate(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._model, name)


def silent_frame() -> UserAudio:
    return UserAudio(gen=1, samples=np.zeros(FRAME, np.float32), is_speech=False)


def speak(stage: ASRStage, audio: np.ndarray) -> list[Transcript]:
    """The sentence's frames, all voiced, processed in order (no stage thread: by hand)."""
    out = []
    for i in range(0, len(audio) - FRAME + 1, FRAME):
        frame = UserAudio(gen=1, samples=audio[i:i + FRAME], is_speech=True)
        out += [f for f in stage.process(frame) if isinstance(f, Transcript)]
    return out


def test_a_periodic_partial_is_given_up_for_the_silence_read_behind_it(transcriber, say, monkeypatch):
    audio = trimmed(say(SENTENCE, "flite")[0])  # flite is deterministic (Piper adds noise per run)
    assert len(audio) > 2 * 700 * 16  # long enough for two periodic partials (every 700 ms of audio)
    model = CountingModel(transcriber.model.model)
    monkeypatch.setattr(transcriber.model, "model", model)

    def stage() -> ASRStage:
        return ASRStage(transcriber, ASRConfig(partial_interval_ms=700), lambda: "en", WaterfallBook())

    # nothing queued: the periodic partials run (the harness does make them due)
    assert len(speak(stage(), audio)) >= 2 and model.decodes >= 2

    # the silence is queued already: no Whisper call at all until the read at its onset
    model.encodes = model.decodes = 0
    quiet = stage()
    quiet.put(silent_frame())
    assert speak(quiet, audio) == [] and model.encodes == 0
    read = [f for f in quiet.process(quiet._inbox.get()) if isinstance(f, Transcript)]
    assert [t.is_at_silence for t in read] == [True] and wer(SENTENCE, read[0].text) == 0.0, read
    assert (model.encodes, model.decodes) == (1, 1)

    # the silence comes during the first partial's encoder: its decoder is not run
    model.encodes = model.decodes = 0
    late = stage()
    model.on_encode = lambda: late.put(silent_frame()) if model.encodes == 1 else None
    assert speak(late, audio) == [] and (model.encodes, model.decodes) == (1, 0)
    read = [f for f in late.process(late._inbox.get()) if isinstance(f, Transcript)]
    assert read and wer(SENTENCE, read[0].text) == 0.0, read
