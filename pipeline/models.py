"""The loaded models a Pipeline needs, loaded once and shared by every session."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from engine.backends.base import LLMBackend
from pipeline.asr.whisper import WhisperTranscriber
from pipeline.endpointing.smart_turn import SmartTurnModel
from pipeline.persona.persona import Voice
from pipeline.tts.base import TTSBackend
from pipeline.vad.silero import SileroModel

log = logging.getLogger(__name__)


@dataclass
class PipelineModels:
    """What a front end builds once (the app resolves specs to paths) and passes to each Pipeline."""

    llm: LLMBackend
    tts: Callable[[Voice], TTSBackend]  # usually a pipeline.tts.TTSProvider
    transcriber: WhisperTranscriber | None = None
    vad_model: Path | SileroModel | None = None  # a loaded SileroModel is shared by all sessions
    turn_model: SmartTurnModel | None = None  # end of turn from the voice, shared (thread-safe)

    def warm_up(self, voices: list[Voice] = ()) -> None:
        """Run every model once, so the first turn is not the one paying for lazy loading,
        allocations and first-call compilation (a server says ready after it; benchmarks measure
        steady state): a tiny generation and the end-of-turn probe, a Whisper pass, Smart Turn and
        the VAD over noise, and each of ``voices`` loaded (a voice synthesizes once as it loads).
        ``app.parallel_load`` runs the same warm-ups, each on its model's loading thread."""
        started = time.monotonic()
        warm_llm(self.llm)
        if self.transcriber is not None:
            warm_transcriber(self.transcriber)
        if self.turn_model is not None:
            warm_turn_model(self.turn_model)
        if self.vad_model is not None:
            warm_vad(self.vad_model)
        for voice in voices:
            self.tts(voice)
        log.info("models warmed up in %.1f s", time.monotonic() - started)

    def close(self) -> None:
        self.llm.close()


def warm_noise():
    """One second of quiet noise at 16 kHz: speech-like enough to run every model's whole path."""
    import numpy as np

    return (np.random.default_rng(0).standard_normal(16000) * 0.01).astype(np.float32)


def warm_llm(llm: LLMBackend) -> None:
    """A 4-token generation and, on our engine, the end-of-turn probe (its sentence-end token set
    is built on first use). Failures are logged: a remote LLM that is not up yet must not stop a server."""
    from engine.sampling_params import SamplingParams

    try:
        for _ in llm.generate([{"role": "user", "content": "Hi"}], SamplingParams(temperature=0.0, max_tokens=4)):
            pass
    except Exception as error:
        log.warning("LLM warm-up failed (%s); the first turn will try again", error)
    probe = getattr(llm, "probe_sentence_end", None)
    if probe is not None:
        try:
            probe([{"role": "user", "content": "Hi"}])
        except Exception as error:
            log.warning("end-of-turn probe warm-up failed (%s)", error)


def warm_transcriber(transcriber: WhisperTranscriber) -> None:
    """One short-context transcription (the first call allocates CTranslate2's buffers)."""
    transcriber.transcribe(warm_noise())


def warm_turn_model(turn_model: SmartTurnModel) -> None:
    """onnxruntime's first run allocates."""
    turn_model(warm_noise())


def warm_vad(vad_model: Path | SileroModel) -> None:
    from pipeline.vad.silero import FRAME_SAMPLES, SileroVAD

    vad, noise = SileroVAD(vad_model), warm_noise()
    for i in range(0, len(noise) - FRAME_SAMPLES, FRAME_SAMPLES):
        vad(noise[i:i + FRAME_SAMPLES])
