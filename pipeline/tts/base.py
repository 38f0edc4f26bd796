"""The small interface every text-to-speech backend implements."""
from __future__ import annotations

import threading
from typing import Callable, Iterator, Protocol, runtime_checkable

import numpy as np


class TTSError(RuntimeError):
    """A backend that cannot be loaded or cannot speak; the factory falls back on it."""


class Cancel:
    """Stops one ``synthesize`` call from another thread (barge-in). The backend checks
    ``is_cancelled`` between chunks and registers ``on_cancel`` callbacks that abort the work in
    flight (Piper terminates its ONNX run, the command backends kill their process), so a
    cancelled call ends within a fraction of a chunk and yields nothing more."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._is_cancelled = False
        self._callbacks: list[Callable[[], None]] = []

    @property
    def is_cancelled(self) -> bool:
        return self._is_cancelled

    def cancel(self) -> None:
        with self._lock:
            if self._is_cancelled:
                return
            self._is_cancelled = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Calls ``callback`` when cancelled (at once if already cancelled)."""
        with self._lock:
            if not self._is_cancelled:
                self._callbacks.append(callback)
                return
        callback()


@runtime_checkable
class TTSBackend(Protocol):
    """Speaks text. ``synthesize`` yields mono int16 PCM chunks at ``sample_rate`` as soon as each
    is ready, so playback can start before the whole text is spoken; after ``cancel`` is
    cancelled it yields nothing more and returns as soon as it can."""

    name: str
    sample_rate: int

    def synthesize(self, text: str, speaking_rate: float = 1.0,
                   cancel: Cancel | None = None) -> Iterator[np.ndarray]: ...


def pcm16_from_wav_bytes(data: bytes) -> tuple[np.ndarray, int]:
    """Mono int16 samples and rate from a RIFF WAV held in memory.

    Written by hand because tools that stream WAV to stdout (espeak-ng) leave the size fields at
    0x7fffffff: the standard ``wave`` module would trust them; here the data runs to the end.
    """
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise TTSError("not a WAV stream")
    pos, rate, channels, bits = 12, 0, 1, 16
    while pos + 8 <= len(data):
        chunk_id, size = data[pos:pos + 4], int.from_bytes(data[pos + 4:pos + 8], "little")
        body = pos + 8
        if chunk_id == b"fmt ":
            channels = int.from_bytes(data[body + 2:body + 4], "little")
            rate = int.from_bytes(data[body + 4:body + 8], "little")
            bits = int.from_bytes(data[body + 14:body + 16], "little")
        elif chunk_id == b"data":
            if bits != 16 or not rate:
                raise TTSError(f"unsupported WAV: {bits}-bit, {rate} Hz")
            raw = data[body:]
            raw = raw[: len(raw) - len(raw) % (2 * channels)]
            pcm = np.frombuffer(raw, dtype="<i2").reshape(-1, channels)
            return pcm.mean(axis=1).astype(np.int16) if channels > 1 else pcm[:, 0].copy(), rate
        pos = body + size + (size & 1)
    raise TTSError("WAV stream has no data chunk")
