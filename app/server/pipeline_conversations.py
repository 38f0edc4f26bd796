"""The real ConversationFactory: models loaded once per process, one pipeline.Pipeline per session.

Shared between sessions: the LLM backend (our engine schedules concurrent sessions itself), the
Whisper model (calls serialized inside), the TTS voices (TTSProvider caches one per voice) and
the persona store. Per session: the Pipeline (its VAD state, history, queues and threads).
"""
from __future__ import annotations

import itertools
import logging
import threading
import time

from app.commands.common import persona_store
from app.config import AppConfig
from app.voice_models import load_voice_models
from pipeline.config import PipelineConfig
from pipeline.persona.store import PersonaNotFound
from pipeline.pipeline import Pipeline

log = logging.getLogger(__name__)


class PipelineConversations:
    """Opens a Pipeline per session over shared, loaded-once models."""

    def __init__(self, config: AppConfig, llm_backend: str | None = None, llm=None):
        self.config = config
        self.pipeline_config: PipelineConfig = config.pipeline
        self.personas = persona_store(config)
        models = load_voice_models(config, llm_backend, llm)
        self.llm = models.llm
        self.transcriber = models.transcriber
        self.vad_model = models.vad_model  # a loaded SileroModel, shared
        self.turn_model = models.turn_model  # Smart Turn, shared
        self.tts = models.tts
        self._ids = itertools.count(1)
        self._open: set[Pipeline] = set()
        self._lock = threading.Lock()
        self._owns_llm = llm is None

    def persona_names(self) -> list[str]:
        return self.personas.names()

    def default_persona(self) -> str:
        return self.config.personas.default

    def warm_up(self) -> None:
        """Run every model once before the server says ready, so the first turn is not the one
        paying for lazy loading, allocations and first-call compilation: a tiny generation, a
        Whisper pass and a VAD pass over noise, a synthesis with each persona's voice."""
        import numpy as np

        from engine.sampling_params import SamplingParams
        from pipeline.vad.silero import SileroVAD

        started = time.monotonic()
        try:
            for _ in self.llm.generate([{"role": "user", "content": "Hi"}], SamplingParams(temperature=0.0, max_tokens=4)):
                pass
        except Exception as error:  # a remote LLM that is not up yet must not stop the server
            log.warning("LLM warm-up failed (%s); the first turn will try again", error)
        noise = (np.random.default_rng(0).standard_normal(16000) * 0.01).astype(np.float32)
        self.transcriber.transcribe(noise)
        if self.turn_model is not None:
            self.turn_model(noise)
        probe = getattr(self.llm, "probe_sentence_end", None)
        if probe is not None:
            try:
                probe([{"role": "user", "content": "Hi"}])
            except Exception as error:
                log.warning("end-of-turn probe warm-up failed (%s)", error)
        vad = SileroVAD(self.vad_model)
        for i in range(0, len(noise) - 512, 512):
            vad(noise[i:i + 512])
        voices = {}
        for name in self.persona_names():
            try:
                voice = self.personas.get(name).voice
            except Exception:  # a broken user persona is reported when someone picks it
                continue
            voices.setdefault(repr(voice), voice)
        for voice in voices.values():
            for _ in self.tts(voice).synthesize("Hello.", voice.speaking_rate):
                pass
        log.info("models warmed up in %.1f s", time.monotonic() - started)

    def open(self, persona: str) -> Pipeline:
        try:
            self.personas.get(persona)
        except PersonaNotFound as error:
            raise KeyError(str(error)) from error
        pipeline = _ClosingPipeline(self, llm=self.llm, tts=self.tts, personas=self.personas, persona=persona,
                                    transcriber=self.transcriber, vad_model=self.vad_model,
                                    config=self.pipeline_config, session=f"ws-{next(self._ids)}",
                                    turn_model=self.turn_model)
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

    def __init__(self, factory: PipelineConversations, **kwargs):
        self._factory = factory
        super().__init__(**kwargs)

    def close(self) -> None:
        try:
            super().close()
            # Our engine keeps a session's KV-cache slot between turns; the conversation is over,
            # so the slot goes back to the pool (other backends have nothing to free).
            end_session = getattr(self._factory.llm, "end_session", None)
            if end_session is not None and self.session:
                end_session(self.session)
        finally:
            self._factory._closed(self)
