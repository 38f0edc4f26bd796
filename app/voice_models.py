"""Every model a voice session needs, loaded once from the app config and shared by all sessions:
the LLM backend, Whisper, the TTS voices (one per distinct voice, on demand), the Silero VAD and
the Smart Turn end-of-turn model.
Used by ``voxlane serve``, ``voxlane converse`` and ``voxlane bench latency`` alike."""
from __future__ import annotations

import os

from app import model_store
from app.backends import make_llm_backend
from app.config import AppConfig
from engine.backends.base import LLMBackend
from pipeline.models import PipelineModels


def load_voice_models(config: AppConfig, llm_backend: str | None = None, llm: LLMBackend | None = None) -> PipelineModels:
    """Resolve the configured model specs (packaged, local or hub) and load each once."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from pipeline.asr.whisper import WhisperTranscriber
    from pipeline.tts import TTSProvider
    from pipeline.endpointing.smart_turn import SmartTurnModel
    from pipeline.vad.silero import SileroModel

    llm = llm if llm is not None else make_llm_backend(config, llm_backend)
    transcriber = WhisperTranscriber(model_store.resolve(config.models.asr, "asr"), config.pipeline.asr)
    tts = TTSProvider(resolve=lambda spec: model_store.resolve(spec, "tts"), fallback=tuple(config.pipeline.tts.fallback))
    # One ONNX session for every conversation: it is stateless (each session's SileroVAD keeps its
    # own state), and loading it per session would cost ~14 MB each.
    vad = SileroModel(model_store.resolve(config.models.vad, "vad"))
    turn = SmartTurnModel(model_store.resolve(config.models.turn, "turn"))  # ~9 MB, shared like the VAD
    return PipelineModels(llm, tts, transcriber, vad, turn)
