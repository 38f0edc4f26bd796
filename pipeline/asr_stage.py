"""ASR stage: a turn's audio in, partial transcripts while the user speaks, one final at the end.

Partials re-transcribe the growing buffer every ``partial_interval_ms`` of audio, skipped when
the stage has fallen behind. At a pause (a short silence inside the turn) the buffer is
transcribed early; if no speech follows before the end of the turn, that result *is* the final,
so the final transcript is ready the moment the VAD declares the turn over.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Iterable

import numpy as np

from pipeline.asr import ASRResult, WhisperTranscriber
from pipeline.config import ASRConfig
from pipeline.frames import Frame, SpeechEnded, SpeechPaused, Transcript, TurnDone, UserAudio
from pipeline.stage import Stage
from pipeline.waterfall import WaterfallBook

log = logging.getLogger(__name__)
RATE = 16000


class ASRStage(Stage):
    """Buffers each turn's audio and transcribes it (see module docstring)."""

    name = "asr"

    def __init__(self, transcriber: WhisperTranscriber, config: ASRConfig, language: Callable[[], str],
                 book: WaterfallBook, queue_size: int = 2000):
        super().__init__(queue_size)
        self.transcriber = transcriber
        self.config = config
        self.language = language
        self.book = book
        self._gen = -1
        self._chunks: list[np.ndarray] = []
        self._num_samples = 0
        self._num_speech_frames = 0
        self._last_partial_at = 0
        self._early: tuple[int, ASRResult] | None = None  # (speech frames when taken, result)

    def _reset(self, gen: int) -> None:
        self._gen, self._chunks, self._num_samples = gen, [], 0
        self._num_speech_frames, self._last_partial_at, self._early = 0, 0, None

    def _buffer(self) -> np.ndarray:
        if len(self._chunks) > 1:
            self._chunks = [np.concatenate(self._chunks)]
        return self._chunks[0] if self._chunks else np.zeros(0, np.float32)

    def process(self, frame: Frame) -> Iterable[Frame]:
        if isinstance(frame, UserAudio):
            if frame.gen != self._gen:
                self._reset(frame.gen)
            self._chunks.append(frame.samples)
            self._num_samples += len(frame.samples)
            self._num_speech_frames += int(frame.is_speech)
            yield from self._maybe_partial(frame)
        elif isinstance(frame, SpeechPaused):
            if frame.gen == self._gen:
                self._early = (self._num_speech_frames, self.transcriber.transcribe(self._buffer(), self.language()))
        elif isinstance(frame, SpeechEnded):
            yield frame
            yield from self._final(frame)
        else:
            yield frame

    def _maybe_partial(self, frame: UserAudio) -> Iterable[Frame]:
        due = self._num_samples - self._last_partial_at >= self.config.partial_interval_ms * RATE // 1000
        # Behind on audio (more than ~3 frames queued): skip, the final matters more than a partial.
        if not (self.config.is_partial_enabled and due and frame.is_speech and self._inbox.qsize() <= 3):
            return
        self._last_partial_at = self._num_samples
        result = self.transcriber.transcribe(self._buffer(), self.language())
        if result.text and not self.is_stale(frame.gen):
            yield Transcript(gen=frame.gen, text=result.text, is_final=False)

    def _final(self, frame: SpeechEnded) -> Iterable[Frame]:
        if frame.gen != self._gen:
            return
        if self._early is not None and self._early[0] == self._num_speech_frames:
            result = self._early[1]  # no speech since the pause: the early transcript is the final
            self.book.set(frame.gen, "asr_early", 1)
        else:
            result = self.transcriber.transcribe(self._buffer(), self.language())
        self.book.mark(frame.gen, "asr_final", time.monotonic())
        self.book.set(frame.gen, "user_audio_ms", round(1000 * self._num_samples / RATE))
        self._reset(-1)
        if result.dropped:
            log.info("ASR dropped: %s", "; ".join(result.dropped))
        if result.text:
            yield Transcript(gen=frame.gen, text=result.text, is_final=True)
        else:  # VAD heard something, Whisper found no words in it: no turn
            self.book.set(frame.gen, "dropped", "no words recognized")
            yield TurnDone(gen=frame.gen, waterfall=self.book.get(frame.gen))
