"""A conversation through local audio devices: microphone → pipeline → speakers, on threads.

Used by ``voxlane mic`` (pipeline in this process). The device's input rate is whatever it
negotiated (resampled to 16 kHz inside the pipeline); output chunks are resampled to the output
device's rate in the PlaybackBuffer. The EchoGate keeps the assistant from answering itself on
open speakers; playback progress goes back to the pipeline so an interrupted reply is remembered
only as far as it was heard.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from app.audio_devices import AudioDevices
from app.echo_gate import EchoGate
from app.playback_buffer import PlaybackBuffer
from pipeline import frames as f

BLOCK_MS = 20


@dataclass
class VoiceLoopStats:
    """What happened, for the summary line and for tests."""

    transcripts: list[str] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    waterfalls: list[dict] = field(default_factory=list)
    num_interruptions: int = 0  # turns whose audio was still playing when interrupted
    num_pauses: int = 0  # audible playback paused for possible speech (open speakers: often our own echo)
    input_rate_hz: int = 0
    output_rate_hz: int = 0


class LocalVoiceLoop:
    """Runs one pipeline against an input and an output device until stopped."""

    def __init__(self, pipeline, devices: AudioDevices, input_device=None, output_device=None,
                 echo_gate: EchoGate | None = None, on_event: Callable[[str, object], None] | None = None):
        self.pipeline = pipeline
        self.devices = devices
        self.input_device, self.output_device = input_device, output_device
        self.gate = echo_gate
        self.on_event = on_event or (lambda kind, value: None)
        self.stats = VoiceLoopStats()
        self.stop_event = threading.Event()
        self.buffer: PlaybackBuffer | None = None
        self._reply: list[str] = []

    def _play(self, num_samples: int):
        block = self.buffer.read(num_samples)
        if self.gate is not None:
            self.gate.played(block)
        return block

    def _capture(self, block, rate_hz: int) -> None:
        if self.gate is not None:
            block = self.gate.process(block)
        self.pipeline.push_audio(block, rate_hz)  # resampled to 16 kHz inside, once

    def run(self, max_turns: int | None = None, idle_exit_s: float | None = None) -> VoiceLoopStats:
        """Until ``stop_event``, ``max_turns`` answered turns (and their audio played), or — with a
        file "microphone" — the input ended and nothing happened for ``idle_exit_s``."""
        # The output first: its rate is what the playback buffer resamples to. 22050 Hz is Piper's;
        # the device may pick another.
        self.buffer = PlaybackBuffer(22050)
        output = self.devices.open_output(self.output_device, 22050, BLOCK_MS, self._play)
        self.buffer.rate_hz = output.rate_hz
        source = self.devices.open_input(self.input_device, 16000, BLOCK_MS, self._capture)
        self.stats.input_rate_hz, self.stats.output_rate_hz = source.rate_hz, output.rate_hz
        self.on_event("devices", (source.rate_hz, output.rate_hz))
        last_activity = time.monotonic()
        try:
            while not self.stop_event.is_set():
                frame = self.pipeline.next_frame(0.05)
                self._report_playback()
                if frame is not None:
                    last_activity = time.monotonic()
                    self._handle(frame)
                if self.buffer.is_playing():
                    last_activity = time.monotonic()
                done_turns = max_turns is not None and len(self.stats.waterfalls) >= max_turns
                if done_turns and self.buffer.num_buffered == 0:
                    break
                input_done = getattr(self.devices, "is_input_done", None)
                if idle_exit_s is not None and input_done is not None and input_done.is_set() \
                        and time.monotonic() - last_activity > idle_exit_s:
                    break
        finally:
            source.close()
            output.close()
            self._report_playback()
        return self.stats

    def _report_playback(self) -> None:
        for gen, heard in list(self.buffer.heard.items()):
            self.pipeline.report_playback(gen, int(heard))

    def _handle(self, frame: f.Frame) -> None:
        if isinstance(frame, f.AudioOut):
            self.buffer.push(frame.gen, frame.pcm, frame.sample_rate)
        elif isinstance(frame, f.PlaybackPause):
            if self.buffer.num_buffered:  # the pipeline also pauses (nothing) at every speech onset
                self.stats.num_pauses += 1
            self.buffer.is_paused = True
        elif isinstance(frame, f.PlaybackResume):
            self.buffer.is_paused = False
        elif isinstance(frame, f.Interrupt):
            if self.buffer.num_buffered:
                self.stats.num_interruptions += 1
            self.buffer.flush(frame.gen)
        elif isinstance(frame, f.Transcript) and frame.is_final and frame.text:
            self.stats.transcripts.append(frame.text)
            self.on_event("transcript", frame.text)
        elif isinstance(frame, f.TextDelta):
            self._reply.append(frame.text)
            self.on_event("delta", frame.text)
        elif isinstance(frame, f.AssistantDone):
            self.stats.replies.append(frame.text)
            self._reply = []
            self.on_event("reply_done", frame)
        elif isinstance(frame, f.TurnDone):
            self.stats.waterfalls.append(frame.waterfall)
            self.on_event("turn", frame.waterfall)
        elif isinstance(frame, f.ErrorFrame):
            self.on_event("error", f"{frame.stage}: {frame.detail or frame.message}")
