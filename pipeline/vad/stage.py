"""VAD stage: 16 kHz audio in, turns out (speech start/pause/end and the turn's audio).

It opens turns: on a confirmed start it takes a new turn number and sends ``Interrupt``
first, which is the barge-in: everything older is dropped downstream at once. At a pause it
lets the answer start speculatively; ``SpeechEnded`` (a system frame, so it overtakes the
answer in the queues) commits it, and speech resuming voids it. How much silence ends a turn:
the persona's ``silence_ms``, or in "semantic" mode what the endpointer decided at the pause
(its signals arrive on other threads; an ``EndpointTick`` applies the verdict at once).
"""
from __future__ import annotations

import logging
import time
from collections import deque
from typing import Callable, Iterable

import numpy as np

from pipeline.config import VADConfig
from pipeline.endpointing.decision import Verdict
from pipeline.endpointing.endpointer import Endpointer
from pipeline.frames import (AudioIn, EndpointTick, Frame, Interrupt, PlaybackPause, PlaybackResume, SpeechEnded,
                             SpeechPaused, SpeechStarted, TurnAudioEnd, TurnJudged, UserAudio)
from pipeline.persona.persona import Endpointing
from pipeline.stage import Stage
from pipeline.turns import TurnCounter
from pipeline.vad.silero import FRAME_SAMPLES, SileroVAD
from pipeline.vad.turn_detector import TurnDetector
from pipeline.waterfall import WaterfallBook

log = logging.getLogger(__name__)


class VADStage(Stage):
    """Silero per 32 ms frame + the turn detector; forwards the audio of each turn to ASR."""

    name = "vad"

    def __init__(self, vad: SileroVAD, config: VADConfig, counter: TurnCounter,
                 endpointing: Callable[[], Endpointing], book: WaterfallBook, queue_size: int = 2000,
                 endpointer: Endpointer | None = None):
        super().__init__(queue_size)
        self.endpointer = endpointer  # None: every turn ends after the persona's silence_ms
        self.vad = vad
        self.detector = TurnDetector(config)
        self.counter = counter
        self.endpointing = endpointing
        self.book = book
        self._rest = np.zeros(0, np.float32)  # samples short of a whole frame
        self._num_samples = 0  # input samples framed so far: the stream's clock
        self._pre_roll: deque[np.ndarray] = deque(maxlen=max(1, config.pre_roll_ms // 32))
        self._onset: list[np.ndarray] = []  # frames since the onset, sent once the start is confirmed
        self._onset_sample = 0
        self._onset_t = 0.0
        self._turn_gen = 0
        self._last_voiced = (0, 0.0)  # (sample, push time) of the last voiced frame
        # The turn's last 8 s (Smart Turn reads no more), kept across a resumed pause: [250 x 512] floats.
        self._turn_audio: deque[np.ndarray] = deque(maxlen=8000 // 32)
        self._judged: Verdict | None = None  # the verdict already reported with TurnJudged

    def is_turn_data(self, frame: Frame) -> bool:
        return not isinstance(frame, AudioIn)

    def process(self, frame: Frame) -> Iterable[Frame]:
        if isinstance(frame, EndpointTick):
            if frame.gen == self._turn_gen:
                yield from self._apply_verdict(self.detector.poll(self._end_silence_ms()))
            return
        if not isinstance(frame, AudioIn):
            yield frame
            return
        data = np.concatenate([self._rest, frame.samples]) if len(self._rest) else frame.samples
        whole = len(data) - len(data) % FRAME_SAMPLES
        self._rest = data[whole:].copy()
        for start in range(0, whole, FRAME_SAMPLES):
            yield from self._frame(data[start:start + FRAME_SAMPLES], frame.t)

    def _frame(self, samples: np.ndarray, t: float) -> Iterable[Frame]:
        prob = self.vad(samples)
        state_before = self.detector.state
        # The persona is read only when a new onset may begin (the detector ignores it otherwise).
        may_begin = state_before == "idle" and prob >= self.detector.config.pause_threshold
        events = self.detector.update(prob, self.endpointing() if may_begin else None, self._end_silence_ms())
        self._num_samples += FRAME_SAMPLES
        if self.detector.is_voiced:
            self._last_voiced = (self._num_samples, t)
        if "onset" in events:
            self._onset = list(self._pre_roll)
            self._onset_sample = self._num_samples - FRAME_SAMPLES
            self._onset_t = t
            yield PlaybackPause(gen=self.counter.current, at_sample=self._onset_sample)
        if self.detector.state == "onset" or "start" in events:
            self._onset.append(samples)
        if "start" in events:
            self._turn_audio.clear()
            self._turn_audio.extend(self._onset)
        elif state_before == "speaking":
            self._turn_audio.append(samples)
        if "blip" in events:
            self._onset = []
            yield PlaybackResume(gen=self.counter.current)
        if "resume" in events:
            # Speech after a pause: the answer started at the pause is void; the utterance goes on
            # under a new gen (ASR keeps its audio, see ASRStage).
            if self.endpointer is not None:
                self.endpointer.forget()
            resumed, gen = self._turn_gen, self.counter.next()
            self._turn_gen = gen
            self.book.mark(gen, "speech_start", self._onset_t)
            yield Interrupt(gen=gen, reason="resume", resumes_gen=resumed)
            yield SpeechStarted(gen=gen, at_sample=self._onset_sample, is_continuation=True)
        if "start" in events:
            gen = self._turn_gen = self.counter.next()
            self.book.mark(gen, "speech_start", self._onset_t)
            yield Interrupt(gen=gen, reason="barge-in")
            yield SpeechStarted(gen=gen, at_sample=self._onset_sample)
            yield UserAudio(gen=gen, samples=np.concatenate(self._onset), is_speech=True)
            self._onset = []
        elif state_before == "speaking" or (self.detector.state == "speaking"):
            yield UserAudio(gen=self._turn_gen, samples=samples, is_speech=self.detector.is_voiced)
        if "pause" in events:  # the answer starts (held until the end; a resume drops it unheard)
            self.book.mark(self._turn_gen, "speech_paused", time.monotonic())
            if self._is_semantic():
                self.endpointer.on_answer(self._turn_gen)  # its words' probe may come before the judging pause
            yield SpeechPaused(gen=self._turn_gen)
        if "judge" in events and self._is_semantic():
            self.endpointer.on_pause(self._turn_gen, np.concatenate(self._turn_audio), self.detector.endpointing)
            if "end" not in events:  # the words' signal was in already: a verdict now may end the turn now
                events = events + self.detector.poll(self._end_silence_ms())
        elif self.detector.silent_ms and self._is_semantic() and "end" not in events:
            # past its deadline the verdict no longer waits for the last word's timing
            if self.endpointer.on_silence(self._turn_gen, self.detector.silent_ms):
                events = events + self.detector.poll(self._end_silence_ms())
        yield from self._apply_verdict(events)
        self._pre_roll.append(samples)

    def _is_semantic(self) -> bool:
        return self.endpointer is not None and self.detector.endpointing.mode == "semantic"

    def _end_silence_ms(self) -> int:
        """The silence that ends the current turn, as known now."""
        if not self._is_semantic():
            return self.detector.endpointing.silence_ms
        return self.endpointer.end_silence_ms(self._turn_gen, self.detector.endpointing)

    def _apply_verdict(self, events: list[str]) -> Iterable[Frame]:
        """Reports a new verdict (once), then ends the turn if ``events`` say so."""
        verdict = self.endpointer.verdict(self._turn_gen) if self._is_semantic() else None
        if verdict is not None and verdict is not self._judged:
            self._judged = verdict
            log.info("turn %d judged %s (voice %s, words %s, fused %s): ends after %d ms of silence", verdict.gen,
                     "complete" if verdict.is_complete else "unfinished", verdict.p_audio, verdict.p_text,
                     verdict.p_complete, verdict.end_silence_ms)
            self.book.mark(verdict.gen, "turn_judged", time.monotonic())
            for name in ("p_audio", "p_text", "p_complete"):
                value = getattr(verdict, name)
                self.book.set(verdict.gen, name, None if value is None else round(value, 4))
            if verdict.is_last_word_late:  # decided without the last word's timing (its deadline passed)
                self.book.set(verdict.gen, "last_word_late", 1)
            yield TurnJudged(gen=verdict.gen, p_audio=verdict.p_audio, p_text=verdict.p_text,
                             p_complete=verdict.p_complete, is_complete=verdict.is_complete,
                             end_silence_ms=verdict.end_silence_ms)
        if "end" in events:
            sample, t_end = self._last_voiced
            self.book.mark(self._turn_gen, "speech_end", t_end)
            self.book.mark(self._turn_gen, "turn_end_detected", time.monotonic())
            yield TurnAudioEnd(gen=self._turn_gen)  # in order behind the audio, for ASR
            yield SpeechEnded(gen=self._turn_gen, at_sample=sample, t_speech_end=t_end)  # at once: commits
