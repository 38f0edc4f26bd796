"""Scripted models behind the real server and pipeline (Silero VAD, turn logic, chunker, stages,
session pump): an LLM that echoes (or stalls, fails, floods on cue words), a TTS that makes a tone
(or fails on cue), a transcriber that hears nothing, and ``make_server`` wiring them into a
running ``voxlane serve`` app on a free loopback port. Fast, so the front-end tests can exercise
every edge without real model time."""
from __future__ import annotations

import threading

import numpy as np

from app.config import AppConfig, ServerConfig
from app.server.app import create_app
from app.server.runner import BackgroundServer
from pipeline.asr.whisper import ASRResult
from pipeline.config import PipelineConfig
from pipeline.persona.store import PersonaNotFound, PersonaStore
from pipeline.pipeline import Pipeline
from pipeline.vad.silero import SileroModel

LIMIT = 256 * 1024  # max_message_bytes here: a 100,000-character text still fits, and is refused for its length


class ScriptedCompletion:
    """Echoes the user's words; ``STALL`` blocks until cancelled (after echoing the words before it),
    ``LLMFAIL`` raises, ``FLOOD`` talks long."""

    def __init__(self, llm: "ScriptedLLM", user: str):
        self.llm, self.user = llm, user
        self.cancelled = threading.Event()
        with llm.lock:
            llm.active += 1

    def __iter__(self):
        try:
            if "STALL" in self.user:  # says what comes before the cue, then stops producing (cancel still works)
                for i, word in enumerate(self.user.split("STALL")[0].split()):
                    yield word if i == 0 else " " + word
                self.cancelled.wait(60)
                return
            if "LLMFAIL" in self.user:
                raise ConnectionError("scripted LLM failure")
            words = ("Lots of words here, all of them spoken slowly. " * 40).split() if "FLOOD" in self.user \
                else f"You said: {self.user}.".split()
            for i, word in enumerate(words):
                if self.cancelled.is_set():
                    return
                yield word if i == 0 else " " + word
        finally:
            with self.llm.lock:
                self.llm.active -= 1

    def cancel(self):
        self.cancelled.set()


class ScriptedLLM:
    """An LLMBackend that also keeps per-session "slots" like our engine (freed by end_session)."""

    name = "scripted"

    def __init__(self):
        self.lock = threading.Lock()
        self.active = 0
        self.sessions: set[str] = set()

    def generate(self, messages, sampling, session=None):
        if session:
            with self.lock:
                self.sessions.add(session)
        return ScriptedCompletion(self, messages[-1]["content"])

    def count_tokens(self, messages):
        return sum(len(m["content"].split()) + 4 for m in messages)

    @property
    def context_length(self):
        return 2048

    def end_session(self, session):
        with self.lock:
            self.sessions.discard(session)

    def close(self):
        pass


class ScriptedTTS:
    """0.1 s per word; 10 s per chunk of a FLOOD answer; raises on the word "kaboom"."""

    name = "scripted"
    sample_rate = 16000

    def synthesize(self, text, speaking_rate=1.0, cancel=None):
        if "kaboom" in text.lower():
            raise RuntimeError("scripted TTS failure")
        n = 160_000 if "slowly" in text else 1600 * len(text.split())
        yield np.full(n, 300, np.int16)


class SilentTranscriber:
    """Whatever the audio, nothing intelligible: audio exercises VAD and turn-taking, not answers."""

    def transcribe(self, audio, language="en"):
        return ASRResult(text="")


class ScriptedModels:
    """A VoiceSessionFactory: a real Pipeline per session over scripted models."""

    def __init__(self, vad_path):
        self.llm = ScriptedLLM()
        self.personas = PersonaStore()
        self.vad_model = SileroModel(vad_path)  # one ONNX session shared by every session, as in serve
        self.tts = ScriptedTTS()
        self.lock = threading.Lock()
        self.open_pipelines: set[Pipeline] = set()
        self.num_opened = 0

    def persona_names(self):
        return self.personas.names()

    def default_persona(self):
        return "nova"

    def open(self, persona, session_id):
        try:
            self.personas.get(persona)
        except PersonaNotFound as error:
            raise KeyError(str(error)) from error
        with self.lock:
            self.num_opened += 1
        pipeline = Pipeline(llm=self.llm, tts=lambda voice: self.tts, personas=self.personas, persona=persona,
                            transcriber=SilentTranscriber(), vad_model=self.vad_model,
                            config=PipelineConfig(), session=session_id)
        factory = self
        original_close = pipeline.close

        def close():
            original_close()
            with factory.lock:
                factory.open_pipelines.discard(pipeline)

        pipeline.close = close
        with self.lock:
            self.open_pipelines.add(pipeline)
        return pipeline

    def close(self):
        for pipeline in list(self.open_pipelines):
            pipeline.close()


def make_server(vad_path, with_ui: bool = False, with_api: bool = False, log_level: str = "warning", llm=None,
                **server_settings) -> BackgroundServer:
    """A server on ``server_settings``' host (127.0.0.1 unless given), on a port it binds itself;
    ``with_api``: with the OpenAI-compatible /v1 on the scripted LLM (or ``llm``, e.g. our engine,
    which then also answers the sessions). Timeouts are generous by
    default: on a loaded machine a live socket may go quiet for a second without anything being
    wrong. A test of one timeout sets that one short on a server of its own (their logic is
    tested on a fake clock in test_hardening.py)."""
    settings = dict(max_sessions=4, max_message_bytes=LIMIT, start_timeout_s=30.0, stall_timeout_s=30.0,
                    send_timeout_s=10.0)
    settings.update(server_settings)
    config = AppConfig(server=ServerConfig(**settings))
    factory = ScriptedModels(vad_path)
    if llm is not None:
        factory.llm = llm
    from app.openai_api import openai_router

    routers = (openai_router(factory.llm, "scripted", config.server.max_api_requests),) if with_api else ()
    app = create_app(config, factory, with_ui=with_ui, routers=routers)
    server = BackgroundServer(app, host=config.server.host, log_level=log_level)
    server.factory, server.registry, server.metrics = factory, app.state.registry, app.state.metrics
    return server
