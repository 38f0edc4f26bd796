"""Every model a voice session needs, loaded once from the app config and shared by all sessions:
the LLM backend, Whisper, the TTS voices (one per distinct voice, on demand), the Silero VAD and
the Smart Turn end-of-turn model.
Used by ``voxlane serve``, ``voxlane converse`` and ``voxlane bench latency`` alike.

They load at the same time (``app.parallel_load``), and with ``warm=True`` each is warmed up on
its own loading thread as soon as it is loaded, so the LLM's warm-up overlaps Whisper's load.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from app import model_store
from app.backends import make_llm_backend
from app.config import AppConfig
from app.parallel_load import ModelLoad, load_in_parallel
from app.startup_phases import StartupPhases
from engine.backends.base import LLMBackend
from pipeline.models import PipelineModels, warm_llm, warm_transcriber, warm_turn_model, warm_vad
from pipeline.persona.persona import Voice


def load_voice_models(config: AppConfig, llm_backend: str | None = None, llm: LLMBackend | None = None, *,
                      voices: Sequence[Voice] = (), warm: bool = False,
                      phases: StartupPhases | None = None) -> PipelineModels:
    """Resolve the configured model specs (packaged, local or hub) and load each once, in parallel;
    ``voices`` are loaded too. ``warm``: each model also runs once (``PipelineModels.warm_up``'s
    warm-ups). Raises ``app.parallel_load.ModelLoadError`` naming what failed; the rest is freed."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from pipeline.asr.whisper import WhisperTranscriber
    from pipeline.endpointing.smart_turn import SmartTurnModel
    from pipeline.tts import TTSProvider
    from pipeline.vad.silero import SileroModel

    phases = phases or StartupPhases()
    models = config.models
    tts = TTSProvider(resolve=lambda spec: model_store.resolve(spec, "tts"), fallback=tuple(config.pipeline.tts.fallback))

    def then_warm(key: str, load: Callable[[], Any], warm_up: Callable[[Any], None]) -> Callable[[], Any]:
        def load_and_warm():
            model = load()
            if warm:
                with phases.phase(f"warm {key}"):
                    warm_up(model)
            return model
        return load_and_warm

    loads = {
        # One ONNX session for every conversation: it is stateless (each session's SileroVAD keeps its
        # own state), and loading it per session would cost ~14 MB each.
        "vad": ModelLoad(f"VAD model ({models.vad})",
                         then_warm("vad", lambda: SileroModel(model_store.resolve(models.vad, "vad")), warm_vad)),
        "turn": ModelLoad(f"end-of-turn model ({models.turn})",  # ~9 MB, shared like the VAD
                          then_warm("turn", lambda: SmartTurnModel(model_store.resolve(models.turn, "turn")),
                                    warm_turn_model)),
        "asr": ModelLoad(f"ASR model ({models.asr})",
                         then_warm("asr", lambda: WhisperTranscriber(model_store.resolve(models.asr, "asr"),
                                                                     config.pipeline.asr), warm_transcriber)),
    }
    if llm is None:  # one that was passed in is the caller's to close
        kind = llm_backend or config.llm.backend
        loads["llm"] = ModelLoad(f"LLM ({models.llm}, backend {kind})",
                                 then_warm("llm", lambda: make_llm_backend(config, llm_backend), warm_llm),
                                 close=lambda backend: backend.close())
    distinct = {(v.backend, v.voice): v for v in voices}.values()  # the speaking rate applies per call
    for i, voice in enumerate(distinct):  # a voice synthesizes once as it loads
        loads[f"voice {i}"] = ModelLoad(f"voice {voice.backend}:{voice.voice}", lambda voice=voice: tts(voice))
    started = time.monotonic()
    loaded = load_in_parallel(loads, phases)
    phases.record("models loaded" + (" and warmed" if warm else ""), time.monotonic() - started)
    if llm is not None and warm:
        warm_llm(llm)
    return PipelineModels(llm if llm is not None else loaded["llm"], tts, loaded["asr"], loaded["vad"], loaded["turn"])
