"""The local sound card, behind a small interface with a file-backed test double.

``SoundDevices`` uses sounddevice (PortAudio), imported lazily so a machine without PortAudio can
still run the server. ``FileDevices`` reads the "microphone" from a WAV file and records what is
"played" into memory, so ``voxlane mic`` is testable with no sound card at all.

Sample rates are negotiated with the device, never assumed: ``open_input`` asks for ``rate`` (the
pipeline's 16 kHz) and falls back on the device's default rate; callers resample at the edge.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import numpy as np


class AudioDeviceError(RuntimeError):
    """No PortAudio, no device, or a device that refuses every setting we tried: the message says
    which, and what to do."""


def require_devices(infos) -> None:
    """Raises AudioDeviceError unless there is at least one input and one output device."""
    for kind, attr in (("input (microphone)", "max_input_channels"), ("output (speakers)", "max_output_channels")):
        if not any(getattr(d, attr) > 0 for d in infos):
            raise AudioDeviceError(f"no {kind} sound device found. Check that one is plugged in and that this "
                                   "user may use it (Linux: the 'audio' group), or talk from another machine's "
                                   "browser / `voxlane client`.")


@dataclass(frozen=True)
class DeviceInfo:
    """One sound device as the user picks it (``--input`` / ``--output`` take the index or a name part)."""

    index: int
    name: str
    max_input_channels: int
    max_output_channels: int
    default_rate_hz: int
    is_default_input: bool = False
    is_default_output: bool = False


InputCallback = Callable[[np.ndarray, int], None]  # (mono int16 block, the stream's rate in Hz)
OutputSource = Callable[[int], np.ndarray]  # "give me n mono int16 samples" (zeros when idle)


class Stream(Protocol):
    """A running input or output stream; ``rate_hz`` is what the device actually runs at."""

    rate_hz: int

    def close(self) -> None: ...


class AudioDevices(Protocol):
    """What ``voxlane mic`` needs from a sound system."""

    def list(self) -> list[DeviceInfo]: ...

    def open_input(self, device: str | int | None, rate_hz: int, block_ms: int, on_block: InputCallback) -> Stream: ...

    def open_output(self, device: str | int | None, rate_hz: int, block_ms: int, source: OutputSource) -> Stream: ...


def _import_sounddevice():
    try:
        import sounddevice
    except OSError as error:  # raised at import when libportaudio is missing
        raise AudioDeviceError(
            f"PortAudio is not available ({error}). Install it (Debian/Ubuntu: sudo apt-get install "
            "libportaudio2; macOS: brew install portaudio) or use `voxlane client --wav FILE`.") from error
    return sounddevice


class _SDStream:
    def __init__(self, stream, rate_hz: int):
        self._stream = stream
        self.rate_hz = rate_hz

    def close(self) -> None:
        self._stream.stop()
        self._stream.close()


class SoundDevices:
    """The real sound card through sounddevice/PortAudio."""

    def __init__(self) -> None:
        self.sd = _import_sounddevice()

    def list(self) -> list[DeviceInfo]:
        try:
            devices = self.sd.query_devices()
            default_in, default_out = self.sd.default.device
        except Exception as error:  # PortAudio present but broken (no ALSA config, no server)
            raise AudioDeviceError(f"cannot list sound devices: {error}") from error
        return [DeviceInfo(i, d["name"], d["max_input_channels"], d["max_output_channels"],
                           int(d["default_samplerate"]), i == default_in, i == default_out)
                for i, d in enumerate(devices)]

    def _pick(self, device: str | int | None, kind: str) -> int | None:
        infos = self.list()
        usable = [d for d in infos if (d.max_input_channels if kind == "input" else d.max_output_channels) > 0]
        if not usable:
            raise AudioDeviceError(f"no {kind} sound device found (voxlane mic --list shows what PortAudio sees)")
        if device is None or device == "":
            return None  # PortAudio's default
        if isinstance(device, int) or str(device).isdigit():
            index = int(device)
            if any(d.index == index for d in usable):
                return index
            raise AudioDeviceError(f"no {kind} device with index {index}; see voxlane mic --list")
        matches = [d for d in usable if str(device).lower() in d.name.lower()]
        if not matches:
            raise AudioDeviceError(f"no {kind} device whose name contains {device!r}; see voxlane mic --list")
        return matches[0].index

    def _negotiate(self, index: int | None, rate_hz: int, kind: str) -> int:
        """The wanted rate if the device takes it, else the device's own default rate."""
        check = self.sd.check_input_settings if kind == "input" else self.sd.check_output_settings
        try:
            check(device=index, samplerate=rate_hz, channels=1, dtype="int16")
            return rate_hz
        except Exception:
            info = self.sd.query_devices(index, kind)
            fallback = int(info["default_samplerate"])
            try:
                check(device=index, samplerate=fallback, channels=1, dtype="int16")
            except Exception as error:
                raise AudioDeviceError(f"the {kind} device refuses mono 16-bit audio at {rate_hz} "
                                       f"and {fallback} Hz: {error}") from error
            return fallback

    def open_input(self, device, rate_hz, block_ms, on_block) -> Stream:
        index = self._pick(device, "input")
        rate = self._negotiate(index, rate_hz, "input")

        def callback(indata, frames, time_info, status):
            on_block(indata[:, 0].copy(), rate)

        stream = self.sd.InputStream(device=index, samplerate=rate, channels=1, dtype="int16",
                                     blocksize=rate * block_ms // 1000, callback=callback)
        stream.start()
        return _SDStream(stream, rate)

    def open_output(self, device, rate_hz, block_ms, source) -> Stream:
        index = self._pick(device, "output")
        rate = self._negotiate(index, rate_hz, "output")

        def callback(outdata, frames, time_info, status):
            outdata[:, 0] = source(frames)

        stream = self.sd.OutputStream(device=index, samplerate=rate, channels=1, dtype="int16",
                                      blocksize=rate * block_ms // 1000, callback=callback)
        stream.start()
        return _SDStream(stream, rate)


class _ThreadStream:
    """A thread that calls ``tick`` every block (in real time, or as fast as possible)."""

    def __init__(self, rate_hz: int, block: int, tick: Callable[[], bool], is_realtime: bool):
        self.rate_hz = rate_hz
        self._stop = threading.Event()
        self._tick, self._period, self._is_realtime = tick, block / rate_hz, is_realtime
        self._thread = threading.Thread(target=self._run, name="file-audio", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set() and self._tick():
            if self._is_realtime:
                next_t += self._period
                self._stop.wait(max(0.0, next_t - time.monotonic()))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class FileDevices:
    """Test double: the microphone plays ``input_wav`` (then ``tail_s`` of silence, then stops
    delivering), and everything played is appended to ``played`` at the output's rate.

    ``device_rate_hz`` simulates a device that only runs at that rate (e.g. 48000), so the
    caller's resampling is exercised. ``mix_echo`` adds the played signal (times that gain, one
    block late) to the microphone, like speakers heard by a laptop mic."""

    def __init__(self, input_wav: str | Path, device_rate_hz: int = 48000, tail_s: float = 8.0,
                 is_realtime: bool = True, mix_echo: float = 0.0):
        from pipeline.audio import resample_once, to_mono_float32
        from pipeline.wavfile import read_wav

        pcm, rate, channels = read_wav(input_wav)
        mono = to_mono_float32(pcm, channels)
        mono = resample_once(mono, rate, device_rate_hz)
        self.device_rate_hz = device_rate_hz
        tail = np.zeros(int(tail_s * device_rate_hz), np.float32)
        self.mic = np.clip(np.concatenate([mono, tail]) * 32768, -32768, 32767).astype(np.int16)
        self.is_realtime = is_realtime
        self.mix_echo = mix_echo
        self.played: list[np.ndarray] = []
        self._echo: queue.SimpleQueue = queue.SimpleQueue()
        self.is_input_done = threading.Event()

    def list(self) -> list[DeviceInfo]:
        return [DeviceInfo(0, "file microphone", 1, 0, self.device_rate_hz, True, False),
                DeviceInfo(1, "memory speaker", 0, 1, self.device_rate_hz, False, True)]

    def open_input(self, device, rate_hz, block_ms, on_block) -> Stream:
        rate = self.device_rate_hz  # the "device" only runs at its own rate: the caller must resample
        block = rate * block_ms // 1000
        position = [0]

        def tick() -> bool:
            start = position[0]
            if start >= len(self.mic):
                self.is_input_done.set()
                return False
            chunk = self.mic[start:start + block].astype(np.int32)
            if self.mix_echo:
                try:
                    echo = self._echo.get_nowait()
                    n = min(len(echo), len(chunk))
                    chunk[:n] += (echo[:n] * self.mix_echo).astype(np.int32)
                except queue.Empty:
                    pass
            position[0] = start + block
            on_block(np.clip(chunk, -32768, 32767).astype(np.int16), rate)
            return True

        return _ThreadStream(rate, block, tick, self.is_realtime)

    def open_output(self, device, rate_hz, block_ms, source) -> Stream:
        rate = self.device_rate_hz
        block = rate * block_ms // 1000

        def tick() -> bool:
            out = np.asarray(source(block), np.int16)
            self.played.append(out)
            if self.mix_echo:
                self._echo.put(out)
            return True

        return _ThreadStream(rate, block, tick, is_realtime=True)  # playback always runs at its real pace

    def played_audio(self) -> np.ndarray:
        return np.concatenate(self.played) if self.played else np.zeros(0, np.int16)
