"""Piper (ONNX, VITS) speech: the default voice. Fast on CPU and streams one chunk per sentence."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from pipeline.tts.base import TTSError


class PiperTTS:
    """A Piper voice loaded from its ``.onnx`` file (the config is the same path + ``.json``)."""

    name = "piper"

    def __init__(self, model_path: str | Path, config_path: str | Path | None = None, num_threads: int = 1):
        import json

        import onnxruntime
        from piper import PiperVoice
        from piper.config import PiperConfig
        from piper.voice import ESPEAK_DATA_DIR

        model_path = Path(model_path)
        config_path = Path(config_path) if config_path else Path(str(model_path) + ".json")
        if not model_path.is_file() or not config_path.is_file():
            raise TTSError(f"Piper voice not found: {model_path} (+ {config_path.name})")
        # Built here rather than by PiperVoice.load for the session options: onnxruntime's worker
        # threads spin after each run by default, stealing the CPU the LLM is generating on. One
        # thread: Piper runs while the LLM generates the next chunk on the other core (measured
        # here under load: first 5-word chunk 139 ms with 1 thread, 168 ms with 2).
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = num_threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = onnxruntime.InferenceSession(str(model_path), sess_options=options,
                                               providers=["CPUExecutionProvider"])
        config = PiperConfig.from_dict(json.loads(config_path.read_text(encoding="utf-8")))
        self.voice = PiperVoice(config=config, session=session, espeak_data_dir=Path(ESPEAK_DATA_DIR),
                                download_dir=Path.cwd())
        self.sample_rate = int(self.voice.config.sample_rate)
        for _ in self.synthesize("Ready."):  # the first run allocates; keep that out of the first turn
            pass

    def synthesize(self, text: str, speaking_rate: float = 1.0) -> Iterator[np.ndarray]:
        from piper import SynthesisConfig

        if not text.strip():
            return
        # Piper's length_scale is a duration multiplier: faster speech means a smaller scale.
        config = SynthesisConfig(length_scale=1.0 / speaking_rate)
        for chunk in self.voice.synthesize(text, syn_config=config):
            yield chunk.audio_int16_array.reshape(-1)
