"""The loaded models a Pipeline needs, loaded once and shared by every session."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from engine.backend import LLMBackend
from pipeline.asr import WhisperTranscriber
from pipeline.persona import Voice
from pipeline.tts.base import TTSBackend


@dataclass
class PipelineModels:
    """What a front end builds once (the app resolves specs to paths) and passes to each Pipeline."""

    llm: LLMBackend
    tts: Callable[[Voice], TTSBackend]  # usually a pipeline.tts.TTSProvider
    transcriber: WhisperTranscriber | None = None
    vad_model_path: Path | None = None

    def close(self) -> None:
        self.llm.close()
