"""Reading and writing 16-bit PCM WAV files (the CLI tools' input and output)."""
from __future__ import annotations

import wave
from pathlib import Path

import numpy as np


def read_wav(path: str | Path) -> tuple[np.ndarray, int, int]:
    """(interleaved int16 samples, sample_rate, channels)."""
    with wave.open(str(path), "rb") as wav:
        if wav.getsampwidth() != 2:
            raise ValueError(f"{path}: only 16-bit PCM WAV is supported, got {8 * wav.getsampwidth()}-bit")
        data = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").copy()
        return data, wav.getframerate(), wav.getnchannels()


def write_wav(path: str | Path, pcm: np.ndarray, sample_rate: int, channels: int = 1) -> None:
    if pcm.dtype != np.int16:
        pcm = np.clip(np.asarray(pcm, np.float32) * 32768.0, -32768, 32767).astype(np.int16)
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(2)
        wav.setframerate(sample_rate)
        wav.writeframes(pcm.astype("<i2").tobytes())
