"""Piper (ONNX, VITS) speech: the default voice. Fast on CPU and streams one chunk per sentence."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from pipeline.tts.base import TTSError


class PiperTTS:
    """A Piper voice loaded from its ``.onnx`` file (the config is the same path + ``.json``)."""

    name = "piper"

    def __init__(self, model_path: str | Path, config_path: str | Path | None = None):
        from piper import PiperVoice

        model_path = Path(model_path)
        config_path = Path(config_path) if config_path else Path(str(model_path) + ".json")
        if not model_path.is_file() or not config_path.is_file():
            raise TTSError(f"Piper voice not found: {model_path} (+ {config_path.name})")
        self.voice = PiperVoice.load(str(model_path), config_path=str(config_path))
        self.sample_rate = int(self.voice.config.sample_rate)

    def synthesize(self, text: str, speaking_rate: float = 1.0) -> Iterator[np.ndarray]:
        from piper import SynthesisConfig

        if not text.strip():
            return
        # Piper's length_scale is a duration multiplier: faster speech means a smaller scale.
        config = SynthesisConfig(length_scale=1.0 / speaking_rate)
        for chunk in self.voice.synthesize(text, syn_config=config):
            yield chunk.audio_int16_array.reshape(-1)
