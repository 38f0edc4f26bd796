"""Coqui TTS (the ``TTS`` package, e.g. XTTS or VITS models) behind the same interface.

Optional: used when ``TTS`` imports and a model is configured (a local model directory or a
model name Coqui knows). On this project's reference machine it cannot import with CPU torch,
so the factory falls back to the next backend.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from pipeline.tts.base import Cancel, TTSError


class CoquiTTS:
    """A Coqui model; synthesizes a whole chunk at a time (our chunks are clause-sized)."""

    name = "coqui"

    def __init__(self, model: str | Path):
        try:
            from TTS.api import TTS
        except Exception as error:  # ImportError, or a torch ABI mismatch raising something else
            raise TTSError(f"Coqui TTS is not importable: {type(error).__name__}: {error}") from error
        path = Path(model).expanduser()
        try:
            if path.is_dir():
                self.tts = TTS(model_path=str(path), config_path=str(path / "config.json"), progress_bar=False)
            else:
                self.tts = TTS(model_name=str(model), progress_bar=False)
        except Exception as error:
            raise TTSError(f"Coqui model {model!s} could not load: {error}") from error
        self.sample_rate = int(self.tts.synthesizer.output_sample_rate)

    def synthesize(self, text: str, speaking_rate: float = 1.0, cancel: Cancel | None = None) -> Iterator[np.ndarray]:
        """Coqui's call cannot be stopped mid-way: a cancel drops its result (our chunks are short)."""
        if not text.strip() or (cancel is not None and cancel.is_cancelled):
            return
        wav = np.asarray(self.tts.tts(text=text, speed=speaking_rate), dtype=np.float32)
        if cancel is None or not cancel.is_cancelled:
            yield (np.clip(wav, -1.0, 1.0) * 32767).astype(np.int16)
