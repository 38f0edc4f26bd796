"""The loaded models a Pipeline needs, loaded once and shared by every session."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from engine.backends.base import LLMBackend
from pipeline.asr.whisper import WhisperTranscriber
from pipeline.endpointing.smart_turn import SmartTurnModel
from pipeline.persona.persona import Voice
from pipeline.tts.base import TTSBackend
from pipeline.vad.silero import SileroModel


@dataclass
class PipelineModels:
    """What a front end builds once (the app resolves specs to paths) and passes to each Pipeline."""

    llm: LLMBackend
    tts: Callable[[Voice], TTSBackend]  # usually a pipeline.tts.TTSProvider
    transcriber: WhisperTranscriber | None = None
    vad_model: Path | SileroModel | None = None  # a loaded SileroModel is shared by all sessions
    turn_model: SmartTurnModel | None = None  # end of turn from the voice, shared (thread-safe)

    def warm_up(self, voice: Voice | None = None) -> None:
        """One tiny generation and synthesis, so the first turn is not the one paying for
        allocations and lazy initialisation (benchmarks measure steady state)."""
        from engine.sampling_params import SamplingParams

        for _ in self.llm.generate([{"role": "user", "content": "Hi"}], SamplingParams(temperature=0.0, max_tokens=2)):
            pass
        probe = getattr(self.llm, "probe_sentence_end", None)
        if probe is not None:  # the engine's sentence-end token set is built on first use
            probe([{"role": "user", "content": "Hi"}])
        if self.turn_model is not None:  # onnxruntime's first run allocates
            import numpy as np

            self.turn_model(np.zeros(16000, np.float32))
        if voice is not None:
            self.tts(voice)

    def close(self) -> None:
        self.llm.close()
