"""TTS stage: speakable chunks in, assistant audio out, streamed chunk by chunk.

It is the last stage, so it closes each turn with ``TurnDone`` (after the model is done and
all the turn's audio is out, or after an error). An interruption cancels the synthesis in flight
(``Cancel``): no audio of the old turn is made after it, and the stage is free at once."""
from __future__ import annotations

import threading
from typing import Callable, Iterable

from pipeline.audio import resample_once
from pipeline.frames import AssistantDone, AudioOut, ErrorFrame, Frame, Interrupt, SpeakChunk, SystemFrame, TurnDone
from pipeline.persona.persona import Voice
from pipeline.stage import Stage
from pipeline.tts.base import Cancel, TTSBackend
from pipeline.waterfall import WaterfallBook


class TTSStage(Stage):
    """Speaks each chunk with the voice the LLM stage attached to it (the turn's persona)."""

    name = "tts"

    def __init__(self, provider: Callable[[Voice], TTSBackend], book: WaterfallBook,
                 output_sample_rate: int = 0, queue_size: int = 2000):
        super().__init__(queue_size)
        self.provider = provider
        self.book = book
        self.output_sample_rate = output_sample_rate
        self._turn_samples: dict[int, int] = {}  # audio already emitted per turn (its next start_sample)
        self._call: tuple[int, Cancel] | None = None  # the synthesis in flight: (gen, its cancel)
        self._lock = threading.Lock()

    def on_system(self, frame: SystemFrame) -> None:
        if isinstance(frame, Interrupt):
            # Stop the synthesis in flight at once, from the interrupting thread: the stage is free
            # for the next turn within a fraction of a sentence, not after the whole chunk.
            with self._lock:
                if self._call is not None and self._call[0] < frame.gen:
                    self._call[1].cancel()
            # Interrupted turns never reach AssistantDone: forget them here.
            for gen in [g for g in self._turn_samples if g < frame.gen]:
                self._turn_samples.pop(gen, None)

    def process(self, frame: Frame) -> Iterable[Frame]:
        if isinstance(frame, SpeakChunk):
            yield frame
            yield from self._speak(frame)
        elif isinstance(frame, (AssistantDone, ErrorFrame)):
            yield frame
            if isinstance(frame, ErrorFrame):
                self.book.set(frame.gen, "error", f"{frame.stage}: {frame.message}")
            self._turn_samples.pop(frame.gen, None)
            yield TurnDone(gen=frame.gen, waterfall=self.book.get(frame.gen))
        else:
            yield frame

    def _speak(self, chunk: SpeakChunk) -> Iterable[Frame]:
        voice = chunk.voice or Voice()
        tts = self.provider(voice)
        rate = self.output_sample_rate or tts.sample_rate
        cancel = Cancel()
        with self._lock:
            self._call = (chunk.gen, cancel)
        try:
            if self.is_stale(chunk.gen):  # interrupted before the call was registered
                return
            for pcm in tts.synthesize(chunk.text, voice.speaking_rate, cancel=cancel):
                if self.is_stale(chunk.gen):
                    return  # interrupted: drop the rest of the old turn's text
                if rate != tts.sample_rate:
                    pcm = resample_once(pcm, tts.sample_rate, rate)
                start = self._turn_samples.get(chunk.gen, 0)
                self._turn_samples[chunk.gen] = start + len(pcm)
                self.book.mark(chunk.gen, "first_audio_ready")  # made; played once the turn is committed
                self.book.add(chunk.gen, "audio_out_samples", len(pcm))
                self.book.set(chunk.gen, "audio_sample_rate", rate)
                yield AudioOut(gen=chunk.gen, pcm=pcm, sample_rate=rate, start_sample=start,
                               chunk_index=chunk.index, text=chunk.text)
        finally:
            with self._lock:
                self._call = None
            if chunk.on_synthesized is not None:  # made, dropped or failed: the answer writes on
                chunk.on_synthesized()
