"""The audio edge: any sample rate, channel count and sample type in, 16 kHz mono float32 out.

Resampling happens once, here, with soxr (a real band-limited resampler: naive decimation
aliases and makes the "demonic voice" users complain about).
"""
from __future__ import annotations

import numpy as np

PIPELINE_RATE = 16000


def to_mono_float32(samples: np.ndarray, channels: int = 1) -> np.ndarray:
    """Interleaved (or 2-D frames × channels) int16/int32/float samples → mono float32 in [-1, 1]."""
    samples = np.asarray(samples)
    if samples.dtype == np.int16:
        data = samples.astype(np.float32) / 32768.0
    elif samples.dtype == np.int32:
        data = samples.astype(np.float32) / 2147483648.0
    elif samples.dtype == np.uint8:
        data = (samples.astype(np.float32) - 128.0) / 128.0
    else:
        data = samples.astype(np.float32, copy=False)
    if data.ndim == 2:
        return data.mean(axis=1, dtype=np.float32)
    if channels > 1:
        data = data[: len(data) - len(data) % channels].reshape(-1, channels).mean(axis=1, dtype=np.float32)
    return data


class Resampler:
    """A streaming resampler whose state carries across pushes (no clicks at chunk edges).
    Rebuilt when the input rate changes."""

    def __init__(self, out_rate: int = PIPELINE_RATE):
        self.out_rate = out_rate
        self.in_rate = 0
        self._stream = None

    def __call__(self, mono: np.ndarray, in_rate: int) -> np.ndarray:
        if in_rate == self.out_rate:
            return mono
        if in_rate != self.in_rate:
            import soxr

            self.in_rate = in_rate
            self._stream = soxr.ResampleStream(in_rate, self.out_rate, 1, dtype="float32", quality="HQ")
        return self._stream.resample_chunk(mono)

    def flush(self) -> np.ndarray:
        if self._stream is None:
            return np.zeros(0, np.float32)
        return self._stream.resample_chunk(np.zeros(0, np.float32), last=True)


def resample_once(samples: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """A whole buffer at once (output audio to a front end's rate, files)."""
    if in_rate == out_rate or len(samples) == 0:
        return samples
    import soxr

    if samples.dtype == np.int16:
        out = soxr.resample(samples.astype(np.float32) / 32768.0, in_rate, out_rate)
        return np.clip(out * 32768.0, -32768, 32767).astype(np.int16)
    return soxr.resample(samples, in_rate, out_rate).astype(np.float32)
