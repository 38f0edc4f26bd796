"""Whisper's log-mel features in numpy: what Smart Turn v3 reads (80 mel bands x 800 frames of 10 ms).

The same computation as ``transformers.WhisperFeatureExtractor(chunk_length=8)`` (Apache-2.0;
pipecat ships a numpy copy too, but importing it imports pipecat and its dependencies): waveform
normalized to zero mean and unit variance, centered STFT (n_fft 400, hop 160, periodic Hann),
power spectrum through a Slaney mel filterbank, log10 floored 8 decades below the peak, scaled
to roughly [-1, 1]. Checked against pipecat's copy in tests/pipeline/test_smart_turn.py.
"""
from __future__ import annotations

import functools

import numpy as np

RATE = 16000
N_FFT = 400  # 25 ms windows
HOP = 160  # 10 ms
N_MELS = 80
WINDOW_SAMPLES = 8 * RATE  # Smart Turn reads exactly 8 s


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, np.float64)
    mel = 3.0 * hz / 200.0
    log = hz >= 1000.0
    return np.where(log, 15.0 + np.log(np.maximum(hz, 1e-9) / 1000.0) * 27.0 / np.log(6.4), mel)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, np.float64)
    return np.where(mel >= 15.0, 1000.0 * np.exp(np.log(6.4) / 27.0 * (mel - 15.0)), 200.0 * mel / 3.0)


@functools.cache
def mel_filters() -> np.ndarray:
    """Triangular, area-normalized (Slaney) filters -> [N_FFT // 2 + 1, N_MELS]."""
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(RATE / 2), N_MELS + 2))  # [N_MELS + 2]
    bins = np.linspace(0, RATE // 2, N_FFT // 2 + 1)  # [F]
    slopes = edges[None, :] - bins[:, None]  # [F, N_MELS + 2]
    widths = np.diff(edges)
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(down, up))
    return filters * (2.0 / (edges[2:] - edges[:-2]))[None, :]


@functools.cache
def hann() -> np.ndarray:
    return np.hanning(N_FFT + 1)[:-1]  # periodic, as torch.hann_window


def log_mel(audio: np.ndarray) -> np.ndarray:
    """16 kHz mono audio, exactly ``WINDOW_SAMPLES`` long -> float32 [N_MELS, 800]."""
    if audio.shape != (WINDOW_SAMPLES,):
        raise ValueError(f"expected {WINDOW_SAMPLES} samples, got shape {audio.shape}")
    x = audio.astype(np.float32)
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
    padded = np.pad(x.astype(np.float64), (N_FFT // 2, N_FFT // 2), mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP]  # [801, N_FFT]
    power = np.abs(np.fft.rfft(frames * hann(), axis=-1)) ** 2  # [801, F]
    mel = np.log10(np.maximum(1e-10, power @ mel_filters())).T[:, :-1]  # [N_MELS, 800]
    mel = np.maximum(mel, mel.max() - 8.0)
    return ((mel + 4.0) / 4.0).astype(np.float32)
