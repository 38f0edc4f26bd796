"""Runs a Pipeline on audio files as if someone were talking to it: real-time input (the files,
then silence while the assistant answers), a virtual speaker, and what each turn measured.
Used by ``voxlane converse``, ``voxlane bench latency`` and the tests."""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from app.virtual_player import VirtualPlayer
from pipeline.audio import PIPELINE_RATE, to_mono_float32
from pipeline.frames import (AssistantDone, ErrorFrame, Frame, PlaybackPause, SpeakChunk, SpeechStarted,
                             Transcript, TurnDone)
from pipeline.pipeline import Pipeline
from pipeline.vad.silero import FRAME_SAMPLES

log = logging.getLogger(__name__)
FEED_MS = 20  # pieces of 20 ms, like a microphone callback


@dataclass
class InputAudio:
    """One user turn's file as read: interleaved samples at the file's own rate and channels
    (the pipeline's edge resamples it, as it would a microphone's)."""

    samples: np.ndarray
    sample_rate: int = PIPELINE_RATE
    channels: int = 1

    @property
    def num_frames(self) -> int:
        return len(self.samples) // self.channels


def speech_bounds(audio: np.ndarray, rate: int = PIPELINE_RATE, floor_db: float = -35.0) -> tuple[int, int]:
    """(first, last) sample of a file's speech by energy in 10 ms windows: the *true* start and
    end, independent of the VAD under test."""
    win = rate // 100
    n = len(audio) // win
    if n == 0:
        return 0, 0
    rms = np.sqrt(np.mean(audio[: n * win].reshape(n, win).astype(np.float64) ** 2, axis=1) + 1e-12)
    loud = np.nonzero(20 * np.log10(rms / max(rms.max(), 1e-9)) > floor_db)[0]
    if len(loud) == 0 or rms.max() < 1e-3:
        return 0, 0
    return int(loud[0] * win), int((loud[-1] + 1) * win)


@dataclass
class TurnRecord:
    """One user turn as the front end saw it."""

    gen: int
    user: str = ""
    partials: list[str] = field(default_factory=list)
    assistant: str = ""
    spoken: list[str] = field(default_factory=list)
    error: str = ""
    waterfall: dict = field(default_factory=dict)
    voice_to_voice_ms: float | None = None
    is_done: bool = False


@dataclass
class ScriptedRun:
    """What a run produced: the turns, the virtual speaker (with the played audio), barge-in
    measurements and every output frame in order."""

    turns: list[TurnRecord]
    player: VirtualPlayer
    barge_in_stop_ms: list[float]  # true onset of interrupting speech -> playback stopped (input audio ms)
    barge_in_detect_ms: list[float]  # true onset -> end of the VAD frame that paused playback (audio only)
    frames: list[Frame]


class ScriptedUser:
    """Feeds 16 kHz mono inputs to ``pipeline`` in real time and plays its answers."""

    def __init__(self, pipeline: Pipeline, turn_timeout_s: float = 60.0):
        self.pipeline = pipeline
        self.turn_timeout_s = turn_timeout_s
        self._pushed = 0
        self._last_format = (PIPELINE_RATE, 1)
        self._push_times: list[tuple[int, float]] = []  # (first sample of a piece, when pushed)
        self.player = VirtualPlayer(pipeline.report_playback, lambda: self._pushed)
        self.turns: dict[int, TurnRecord] = {}
        self.order: list[int] = []  # gens in the order SpeechStarted/Transcript opened them
        self.frames: list[Frame] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, name="scripted-user-reader", daemon=True)
        self._is_running = True
        self._reader.start()

    # --- the front end side --------------------------------------------------------------------

    def _read(self) -> None:
        while self._is_running:
            frame = self.pipeline.next_frame(0.05)
            if frame is None:
                continue
            self.player.on_frame(frame)
            with self._changed:
                self.frames.append(frame)
                self._record(frame)
                self._changed.notify_all()

    def _turn(self, gen: int) -> TurnRecord:
        if gen not in self.turns:
            self.turns[gen] = TurnRecord(gen)
            self.order.append(gen)
        return self.turns[gen]

    def _record(self, frame: Frame) -> None:
        if isinstance(frame, SpeechStarted):
            if frame.is_continuation and self.order:  # the same utterance under a new gen
                old = self.order.pop()
                self.turns.pop(old, None)
            self._turn(frame.gen)
        elif isinstance(frame, Transcript):
            turn = self._turn(frame.gen)
            if frame.is_final:
                turn.user = frame.text
            else:
                turn.partials.append(frame.text)
        elif isinstance(frame, SpeakChunk):
            self._turn(frame.gen).spoken.append(frame.text)
        elif isinstance(frame, AssistantDone):
            self._turn(frame.gen).assistant = frame.text
        elif isinstance(frame, ErrorFrame):
            self._turn(frame.gen).error = f"{frame.stage}: {frame.detail or frame.message}"
        elif isinstance(frame, TurnDone):
            turn = self._turn(frame.gen)
            turn.is_done, turn.waterfall = True, frame.waterfall

    # --- the microphone side -------------------------------------------------------------------

    def _feed(self, audio: InputAudio) -> None:
        """Pushes ``audio`` in 20 ms pieces at real-time pace (on a schedule: no drift).
        ``_pushed`` counts in 16 kHz samples, the pipeline's clock."""
        self._last_format = (audio.sample_rate, audio.channels)
        step = audio.sample_rate * FEED_MS // 1000
        start = time.monotonic()
        for i in range(0, audio.num_frames, step):
            due = start + i / audio.sample_rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            piece = audio.samples[i * audio.channels:(i + step) * audio.channels]
            self._push_times.append((self._pushed, time.monotonic()))
            self.pipeline.push_audio(piece, audio.sample_rate, audio.channels)
            self._pushed += round(len(piece) / audio.channels * PIPELINE_RATE / audio.sample_rate)

    def _quiet(self, seconds: float) -> InputAudio:
        rate, channels = self._last_format
        return InputAudio(np.zeros(int(seconds * rate) * channels, np.int16), rate, channels)

    def _silence_until(self, done, timeout_s: float) -> bool:
        """Feeds silence in 100 ms steps until ``done()`` or the timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._changed:
                if done():
                    return True
            self._feed(self._quiet(0.1))
        log.warning("gave up waiting after %.1f s", timeout_s)
        return False

    def time_of_sample(self, sample: int) -> float:
        """When input sample ``sample`` was pushed (monotonic)."""
        for first, t in reversed(self._push_times):
            if first <= sample:
                return t + (sample - first) / PIPELINE_RATE
        return self._push_times[0][1] if self._push_times else 0.0

    def run(self, inputs: list[InputAudio], barge_in_at_s: float | None = None,
            lead_in_s: float = 0.3, is_last_played: bool = True, is_last_heard: bool = True) -> ScriptedRun:
        """Each input is a user turn. With ``barge_in_at_s``, each next input starts that long
        after the assistant's previous answer began playing (interrupting it). Without
        ``is_last_played`` the run ends once the last answer starts playing (benchmarks); without
        ``is_last_heard`` once the last answer is complete, not waiting for its audio to play out
        (when its text is what counts)."""
        if inputs:
            self._last_format = (inputs[0].sample_rate, inputs[0].channels)
        self._feed(self._quiet(lead_in_s))
        true_ends, onsets = [], []
        for index, audio in enumerate(inputs):
            begin, end = speech_bounds(to_mono_float32(audio.samples, audio.channels), audio.sample_rate)
            onsets.append(self._pushed + begin * PIPELINE_RATE // audio.sample_rate)
            true_ends.append(self._pushed + end * PIPELINE_RATE // audio.sample_rate)
            num_turns_before = len(self.order)
            self._feed(audio)
            opened = self._silence_until(lambda: len(self.order) > num_turns_before, 2.5)
            if not opened:
                continue  # silence or noise: no turn, as it should be
            # The turn's gen is looked up each time: a pause + more speech re-opens it under a new gen,
            # and an utterance cut in two by the endpointer opens a second turn: wait for the last.
            def turn() -> TurnRecord:
                return self.turns[self.order[-1]]

            def is_playing() -> bool:
                return turn().gen in self.player.t_first_played or turn().is_done

            is_last = index == len(inputs) - 1
            if barge_in_at_s is not None and not is_last:
                self._silence_until(is_playing, self.turn_timeout_s)
                started = self.player.t_first_played.get(turn().gen)
                if started is not None:
                    self._silence_until(lambda: time.monotonic() >= started + barge_in_at_s, barge_in_at_s + 1)
            elif is_last and not is_last_played:
                self._silence_until(is_playing, self.turn_timeout_s)
            else:
                must_play_out = is_last_heard or not is_last
                self._silence_until(lambda: turn().is_done and (self.player.is_idle() or not must_play_out),
                                    self.turn_timeout_s)
                self._feed(self._quiet(0.25))
        self._close()
        return self._result(true_ends, onsets)

    def _close(self) -> None:
        time.sleep(0.1)
        self._is_running = False
        self._reader.join(2.0)
        self.player.close()

    def _result(self, true_ends: list[int], onsets: list[int]) -> ScriptedRun:
        turns = [self.turns[g] for g in self.order]
        for turn in turns:
            turn.waterfall = self.pipeline.waterfall(turn.gen)  # now with first_audio_played
            speech_start = self._speech_start_sample(turn.gen)
            # The true end of speech is the first file end after the VAD's onset of this turn.
            end = next((e for e in true_ends if e > speech_start), None) if speech_start is not None else None
            marks = self.pipeline.book.marks(turn.gen)
            if end is not None and "first_audio_out" in marks:
                turn.voice_to_voice_ms = round(1000 * (marks["first_audio_out"] - self.time_of_sample(end)), 1)
        stop_ms = []
        for stop in self.player.stops:
            later = [o for o in onsets if o <= stop["input_sample"]]
            if later:
                stop_ms.append(round(1000 * (stop["input_sample"] - later[-1]) / PIPELINE_RATE, 1))
        detect_ms = []
        for stop in self.player.stops:
            pause = next((f for f in reversed(self.frames) if isinstance(f, PlaybackPause)
                          and f.at_sample <= stop["input_sample"]), None)
            later = [o for o in onsets if pause is not None and o <= pause.at_sample + FRAME_SAMPLES]
            if pause is not None and later:
                detect_ms.append(round(1000 * (pause.at_sample + FRAME_SAMPLES - later[-1]) / PIPELINE_RATE, 1))
        return ScriptedRun(turns, self.player, stop_ms, detect_ms, list(self.frames))

    def _speech_start_sample(self, gen: int) -> int | None:
        for frame in self.frames:
            if isinstance(frame, SpeechStarted) and frame.gen == gen:
                return frame.at_sample
        return None
