"""The one session factory: the models, loaded once per process, and a pipeline.Pipeline per
session. ``voxlane serve``, ``voxlane mic`` and ``voxlane bench load`` open their sessions through
it; it warms the models up once, and each pipeline ends its own session (its threads, the LLM's KV
slot) when closed.

Shared between sessions: the LLM backend (our engine schedules concurrent sessions itself), the
Whisper model (calls serialized inside), the TTS voices (TTSProvider caches one per voice) and
the persona store. Per session: the Pipeline (its VAD state, history, queues and threads).
"""
from __future__ import annotations

import threading

from app.commands.common import persona_store
from app.config import AppConfig
from app.startup_phases import StartupPhases
from app.voice_models import load_voice_models
from pipeline.config import PipelineConfig
from pipeline.persona.persona import Voice
from pipeline.pipeline import Pipeline


class PipelineSessions:
    """Opens a Pipeline per session over shared, loaded-once models (a ``VoiceSessionFactory``)."""

    def __init__(self, config: AppConfig, llm_backend: str | None = None, llm=None, *, warm: bool = False,
                 phases: StartupPhases | None = None):
        """Loads every model (in parallel, ``app.voice_models``) with the voice of each persona;
        ``warm`` also runs each once as it loads (what ``warm_up`` does afterwards otherwise)."""
        self.config = config
        self.pipeline_config: PipelineConfig = config.pipeline
        self.personas = persona_store(config)
        self._voices = self._persona_voices()
        self.models = load_voice_models(config, llm_backend, llm, voices=self._voices, warm=warm, phases=phases)
        self.llm = self.models.llm
        self._is_warm = warm
        self._open: set[Pipeline] = set()
        self._lock = threading.Lock()
        self._owns_llm = llm is None

    def persona_names(self) -> list[str]:
        return self.personas.names()

    def default_persona(self) -> str:
        return self.config.personas.default

    def _persona_voices(self) -> list[Voice]:
        voices = {}
        for name in self.persona_names():
            try:
                voice = self.personas.get(name).voice
            except Exception:  # a broken user persona is reported when someone picks it
                continue
            voices.setdefault(repr(voice), voice)
        return list(voices.values())

    def warm_up(self) -> None:
        """Run every model once before the server says ready (``PipelineModels.warm_up``), with the
        voice of each persona; nothing to do when they were warmed as they loaded (``warm=True``)."""
        if not self._is_warm:
            self.models.warm_up(self._voices)
            self._is_warm = True

    def open(self, persona: str, session_id: str) -> Pipeline:
        """The pipeline of session ``session_id`` (also its LLM session: the KV slot it keeps),
        talking as ``persona``; an unknown persona raises PersonaNotFound, a KeyError."""
        pipeline = _ClosingPipeline(self, llm=self.llm, tts=self.models.tts, personas=self.personas, persona=persona,
                                    transcriber=self.models.transcriber, vad_model=self.models.vad_model,
                                    config=self.pipeline_config, session=session_id,
                                    turn_model=self.models.turn_model)
        with self._lock:
            self._open.add(pipeline)
        return pipeline

    @property
    def num_open(self) -> int:
        with self._lock:
            return len(self._open)

    def _closed(self, pipeline: Pipeline) -> None:
        with self._lock:
            self._open.discard(pipeline)

    def close(self) -> None:
        with self._lock:
            pipelines = list(self._open)
        for pipeline in pipelines:
            pipeline.close()
        if self._owns_llm:
            self.llm.close()


class _ClosingPipeline(Pipeline):
    """A Pipeline that tells its factory when it is closed (the factory counts open pipelines)."""

    def __init__(self, factory: PipelineSessions, **kwargs):
        self._factory = factory
        super().__init__(**kwargs)

    def close(self) -> None:
        try:
            super().close()  # ends the LLM session too: the pipeline opened it
        finally:
            self._factory._closed(self)
