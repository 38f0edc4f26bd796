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
        steady state): a tiny generation, a Whisper pass and a VAD pass over noise, and a synthesis
        with each of ``voices``."""
        import numpy as np

        from engine.sampling_params import SamplingParams
        from pipeline.vad.silero import FRAME_SAMPLES, SileroVAD

        started = time.monotonic()
        try:
            for _ in self.llm.generate([{"role": "user", "content": "Hi"}], SamplingParams(temperature=0.0, max_tokens=4)):
                pass
        except Exception as error:  # a remote LLM that is not up yet must not stop the server
            log.warning("LLM warm-up failed (%s); the first turn will try again", error)
        probe = getattr(self.llm, "probe_sentence_end", None)
        if probe is not None:  # the engine's sentence-end token set is built on first use
            try:
                probe([{"role": "user", "content": "Hi"}])
            except Exception as error:
                log.warning("end-of-turn probe warm-up failed (%s)", error)
        noise = (np.random.default_rng(0).standard_normal(16000) * 0.01).astype(np.float32)
        if self.transcriber is not None:
            self.transcriber.transcribe(noise)
        if self.turn_model is not None:  # onnxruntime's first run allocates
            self.turn_model(noise)
        if self.vad_model is not None:
            vad = SileroVAD(self.vad_model)
            for i in range(0, len(noise) - FRAME_SAMPLES, FRAME_SAMPLES):
                vad(noise[i:i + FRAME_SAMPLES])
        for voice in voices:
            for _ in self.tts(voice).synthesize("Hello.", voice.speaking_rate):
                pass
        log.info("models warmed up in %.1f s", time.monotonic() - started)

    def close(self) -> None:
        self.llm.close()
