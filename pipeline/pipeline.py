"""The Pipeline: one conversation (session), wiring VAD → ASR → LLM → TTS and the front end.

Audio or text goes in through methods; typed frames come out of one queue (``next_frame`` /
``frames``) or a callback. See docs/pipeline.md for the front end's contract.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from engine.backends.base import LLMBackend
from pipeline.asr.stage import ASRStage
from pipeline.asr.whisper import WhisperTranscriber
from pipeline.audio import PIPELINE_RATE, Resampler, to_mono_float32
from pipeline.config import PipelineConfig
from pipeline.endpointing.audio_signal import AudioTurnScorer
from pipeline.endpointing.endpointer import Endpointer
from pipeline.endpointing.smart_turn import SmartTurnModel
from pipeline.frame_queue import FrameQueue
from pipeline.frames import (AssistantDone, AudioIn, EndpointTick, Frame, Interrupt, SpeakChunk, SpeechEnded,
                             SystemFrame, TextIn)
from pipeline.llm.history import Exchange, History
from pipeline.llm.stage import LLMStage
from pipeline.persona.persona import Persona, Voice
from pipeline.persona.store import PersonaStore
from pipeline.stage import Stage
from pipeline.tts.base import TTSBackend
from pipeline.tts.stage import TTSStage
from pipeline.turns import DROPPED_ON_INTERRUPT, Turns
from pipeline.vad.silero import SileroModel, SileroVAD
from pipeline.vad.stage import VADStage
from pipeline.waterfall import WaterfallBook

log = logging.getLogger(__name__)


class Pipeline:
    """A running voice session. Threads start in the constructor; ``close()`` ends them all.

    ``transcriber`` and ``vad_model`` may be None for a text-only session; ``vad_model`` is a
    loaded ``SileroModel`` to share between sessions (saves ~12 MB each), or a path. ``personas`` is a
    PersonaStore (re-read at every turn) or one fixed Persona. Models may be shared between
    sessions; everything else (VAD state, history, queues) belongs to this session.
    ``turn_model`` (Smart Turn, shared) and an LLM backend with ``probe_sentence_end`` give the
    end-of-turn signals of personas whose endpointing mode is "semantic"; with neither, every turn
    ends after the persona's ``silence_ms``.
    """

    def __init__(self, *, llm: LLMBackend, tts: Callable[[Voice], TTSBackend],
                 personas: PersonaStore | Persona, persona: str = "nova",
                 transcriber: WhisperTranscriber | None = None,
                 vad_model: str | Path | SileroModel | None = None,
                 config: PipelineConfig | None = None, session: str | None = None,
                 on_frame: Callable[[Frame], None] | None = None, turn_model: SmartTurnModel | None = None):
        self.config = config or PipelineConfig()
        self.session = session
        self._personas = personas
        self._persona_name = persona
        self._on_frame = on_frame
        self.book = WaterfallBook()
        self.turns = Turns(History(), self.book)
        self._resampler = Resampler(PIPELINE_RATE)
        self._input_lock = threading.Lock()
        self._output = FrameQueue(self.config.queues.output_queue_size)
        self._is_closed = False
        self._sink_lock = threading.RLock()  # frames reach the front end one at a time, in order
        size = self.config.queues.stage_queue_size
        self.current_persona()  # fail now, not at the first turn, if the persona does not exist

        stages: list[Stage] = []
        self._endpointer = None
        can_probe = callable(getattr(llm, "probe_sentence_end", None))
        if vad_model is not None and (turn_model is not None or can_probe):
            self._endpointer = Endpointer(AudioTurnScorer(turn_model) if turn_model is not None else None, can_probe,
                                          wake=lambda gen: stages[0].put(EndpointTick(gen=gen)),
                                          times_last_word=transcriber is not None)
        if vad_model is not None:
            stages.append(VADStage(SileroVAD(vad_model), self.config.vad, self.turns.counter,
                                   lambda: self.current_persona().endpointing, self.book, size, self._endpointer))
        if transcriber is not None:
            stages.append(ASRStage(transcriber, self.config.asr, lambda: self.current_persona().language,
                                   self.book, size, self._endpointer))
        self._llm = LLMStage(llm, self.current_persona, self.turns.history, self.config.llm, self.config.chunker,
                             self.book, session, size, self._endpointer, is_spoken=True)
        self._tts = TTSStage(tts, self.book, self.config.tts.output_sample_rate, size)
        stages += [self._llm, self._tts]
        for stage, downstream in zip(stages, stages[1:]):
            stage.connect(downstream.put)
        stages[-1].connect(self._deliver)
        self._stages = stages
        self._first = stages[0]
        self._has_audio_input = vad_model is not None and transcriber is not None
        for stage in stages:
            stage.start()

    # --- input -------------------------------------------------------------------------------

    def push_audio(self, samples: np.ndarray, sample_rate: int = PIPELINE_RATE, channels: int = 1,
                   block: bool = True) -> bool:
        """Microphone audio: any rate, interleaved channels or (frames, channels), int16/int32/float.
        Call with consecutive pieces of one stream; resampled once here to 16 kHz mono. With
        ``block=False`` (the server's event loop) a full VAD queue drops the piece and returns False."""
        if not self._has_audio_input:
            raise RuntimeError("this pipeline was built without VAD/ASR (text-only)")
        if self._is_closed:
            raise RuntimeError("the pipeline is closed")
        with self._input_lock:  # the resampler's state is one stream's
            mono = self._resampler(to_mono_float32(samples, channels), sample_rate)
            if not len(mono):
                return True
            frame = AudioIn(gen=0, samples=mono, t=time.monotonic())
            if block:
                self._first.put(frame)
                return True
            return self._first.offer(frame)

    def text_input(self, text: str) -> int:
        """A typed user turn; it interrupts whatever the assistant was saying. Returns its gen."""
        with self._sink_lock:
            gen = self.turns.open_committed()  # a typed turn is complete as typed: nothing speculative
        self._first.put(Interrupt(gen=gen, reason="text"))
        self._first.put(TextIn(gen=gen, text=text))
        return gen

    def interrupt(self, reason: str = "user") -> int:
        """Stop the assistant now: a stop button ("user"), or the server ending a stalled turn
        ("timeout"). Returns the new turn number."""
        gen = self.turns.counter.next()
        self._first.put(Interrupt(gen=gen, reason=reason))
        return gen

    def speak_notice(self, text: str) -> int:
        """Stop the assistant and say ``text`` in the persona's voice instead, as a turn of its own
        (``Interrupt`` reason "notice", then the usual chunk, audio, done and ``TurnDone``): the
        server's spoken apology for a stalled turn. No LLM, and not part of the history. Returns its gen."""
        with self._sink_lock:
            gen = self.turns.open_committed()  # nothing speculative: play it at once
        self.book.set(gen, "notice", 1)
        self._first.put(Interrupt(gen=gen, reason="notice"))  # reaches every stage before the chunk below
        self._tts.put(SpeakChunk(gen=gen, index=0, text=text, voice=self.current_persona().voice))
        self._tts.put(AssistantDone(gen=gen, text=text))
        return gen

    def report_playback(self, gen: int, played_samples: int) -> None:
        """The front end has played ``played_samples`` of turn ``gen``'s audio (at that turn's
        AudioOut sample_rate). Call it as playback advances, and when playback stops."""
        self.turns.report_playback(gen, played_samples)

    def set_persona(self, name: str) -> None:
        """Switch persona from the next turn on (raises PersonaNotFound for an unknown name)."""
        if isinstance(self._personas, PersonaStore):
            self._personas.get(name)
        self._persona_name = name

    def current_persona(self) -> Persona:
        if isinstance(self._personas, PersonaStore):
            return self._personas.get(self._persona_name)
        return self._personas

    # --- output ------------------------------------------------------------------------------

    def next_frame(self, timeout: float | None = None) -> Frame | None:
        """The next output frame, or None after ``timeout`` seconds (or once closed)."""
        return self._output.get(timeout)

    def frames(self, timeout: float = 0.1) -> Iterator[Frame]:
        """Output frames until ``close()``."""
        while not self._is_closed or not self._output.empty():
            frame = self.next_frame(timeout)
            if frame is not None:
                yield frame

    @property
    def history(self) -> list[Exchange]:
        return self.turns.history.exchanges()

    def waterfall(self, gen: int) -> dict:
        return self.book.get(gen)

    @property
    def turn(self) -> int:
        """The newest turn number (``gen``)."""
        return self.turns.counter.current

    def _deliver(self, frame: Frame) -> None:
        """The end of the line (on the TTS thread, or whichever thread sent a system frame): the
        turn bookkeeping decides what reaches the front end now, later (a speculative answer
        waits for its commit) or never (see pipeline/turns.py)."""
        with self._sink_lock:
            if not isinstance(frame, SystemFrame):
                if self.turns.route(frame):
                    self._release(frame)
                return
            if isinstance(frame, Interrupt):
                self.turns.interrupt(frame.gen)
                self._output.purge(lambda f: isinstance(f, DROPPED_ON_INTERRUPT) and f.gen < frame.gen)
            self._out(frame)
            if isinstance(frame, SpeechEnded):
                for held in self.turns.commit(frame.gen):
                    self._release(held)

    def _release(self, frame: Frame) -> None:
        self.turns.released(frame)
        self._out(frame)

    def _out(self, frame: Frame) -> None:
        # Nobody reading: the oldest frame goes rather than the queue growing or blocking the TTS.
        self._output.put_dropping_oldest(frame)
        if self._on_frame is not None:
            try:
                self._on_frame(frame)
            except Exception:  # a front end's bug must not break the turn
                log.exception("on_frame callback failed")

    # --- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Cancel the turn in flight and end every thread of this session. Idempotent."""
        if self._is_closed:
            return
        self.interrupt()
        for stage in self._stages:
            if not stage.stop(self.config.stop_timeout_s):
                log.warning("stage %s did not stop within %.1f s", stage.name, self.config.stop_timeout_s)
        if self._endpointer is not None:
            self._endpointer.close()
        end_session = getattr(self._llm.backend, "end_session", None)  # our engine keeps a KV slot per session
        if end_session is not None and self.session is not None:
            end_session(self.session)
        self._is_closed = True

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
