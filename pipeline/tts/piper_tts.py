"""Piper (ONNX, VITS) speech: the default voice. Fast on CPU, streams one chunk per sentence, and
stops mid-sentence when cancelled."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from pipeline.tts.base import Cancel, TTSError


class PiperTTS:
    """A Piper voice loaded from its ``.onnx`` file (the config is the same path + ``.json``).

    ``variation`` scales the noise VITS samples per synthesis (the voice config's ``noise_scale``
    and ``noise_w``): 1.0 reads the same text a little differently each time, 0 gives the same
    samples every time (what tests and benchmarks judged by a recogniser want)."""

    name = "piper"

    def __init__(self, model_path: str | Path, config_path: str | Path | None = None, num_threads: int = 1,
                 variation: float = 1.0):
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
        # No CPU memory arena: sessions share this voice and synthesize at once, and the arena keeps
        # every concurrent peak for good, extending in power-of-two steps. Measured here, 8 threads x
        # 5 rounds of two sentences: RSS 779 -> 1878 MiB with the arena, flat at 355-406 MiB
        # without, for ~10% more synthesis time (19.5 s vs 21.7 s in all).
        options.enable_cpu_mem_arena = False
        session = onnxruntime.InferenceSession(str(model_path), sess_options=options,
                                               providers=["CPUExecutionProvider"])
        config = PiperConfig.from_dict(json.loads(config_path.read_text(encoding="utf-8")))
        self.voice = PiperVoice(config=config, session=session, espeak_data_dir=Path(ESPEAK_DATA_DIR),
                                download_dir=Path.cwd())
        self.sample_rate = int(self.voice.config.sample_rate)
        self.variation = variation
        for _ in self.synthesize("Ready."):  # the first run allocates; keep that out of the first turn
            pass

    def synthesize(self, text: str, speaking_rate: float = 1.0, cancel: Cancel | None = None) -> Iterator[np.ndarray]:
        """One chunk per sentence. Runs the ONNX model itself rather than through
        ``PiperVoice.synthesize`` to pass each run a ``RunOptions`` that ``cancel`` can terminate
        mid-run: a long sentence takes a second or more here, too long to finish after a barge-in."""
        import onnxruntime

        if not text.strip():
            return
        cancel = cancel or Cancel()
        config = self.voice.config
        # Piper's length_scale is a duration multiplier: faster speech means a smaller scale.
        scales = np.array([config.noise_scale * self.variation, 1.0 / speaking_rate,
                           config.noise_w_scale * self.variation], np.float32)
        for phonemes in self.voice.phonemize(text):
            if not phonemes:
                continue
            ids = np.array([self.voice.phonemes_to_ids(phonemes)], np.int64)
            inputs = {"input": ids, "input_lengths": np.array([ids.shape[1]], np.int64), "scales": scales}
            if config.num_speakers > 1:
                inputs["sid"] = np.array([config.default_speaker_id], np.int64)
            options = onnxruntime.RunOptions()
            cancel.on_cancel(lambda options=options: setattr(options, "terminate", True))
            if cancel.is_cancelled:
                return
            try:
                audio = self.voice.session.run(None, inputs, options)[0].squeeze()
            except Exception:
                if cancel.is_cancelled:  # onnxruntime stops a terminated run with an error
                    return
                raise
            if cancel.is_cancelled:
                return
            peak = float(np.max(np.abs(audio))) if audio.size else 0.0
            audio = audio / peak if peak > 1e-8 else np.zeros_like(audio)  # Piper normalizes each sentence
            yield np.clip(audio * 32767.0, -32767, 32767).astype(np.int16).reshape(-1)
