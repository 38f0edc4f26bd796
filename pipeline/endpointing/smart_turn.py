"""Smart Turn v3.2 (Daily, BSD-2-Clause): the probability that a speaker has finished their turn,
read from the last <= 8 s of their voice (intonation, pace, the shape of the last words).

The ONNX file ships inside the ``pipecat-ai`` wheel (installed with ``--no-deps``: we take only the
file; see app/model_store.py and THIRD_PARTY_NOTICES.md). Input: 16 kHz mono float audio, the
turn so far; output: P(turn complete). Run at a pause, not every frame: 25-65 ms on one thread.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.endpointing.whisper_features import WINDOW_SAMPLES, log_mel


class SmartTurnModel:
    """The loaded ONNX model; ``run`` is thread-safe, so one instance serves every session."""

    def __init__(self, model_path: str | Path, num_threads: int = 1):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = num_threads
        options.inter_op_num_threads = 1
        # Spinning workers would steal the cores ASR and the LLM need at the same moment.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        self.session = onnxruntime.InferenceSession(str(model_path), sess_options=options,
                                                    providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name

    def __call__(self, audio: np.ndarray) -> float:
        """P(turn complete) for 16 kHz mono float32 audio: the last 8 s, zero-padded in front."""
        audio = np.asarray(audio, np.float32).reshape(-1)[-WINDOW_SAMPLES:]
        window = np.zeros(WINDOW_SAMPLES, np.float32)
        if len(audio):
            window[-len(audio):] = audio
        features = log_mel(window)[None]  # [1, 80, 800]
        (probability,) = self.session.run(None, {self.input_name: features})
        return float(np.asarray(probability).reshape(-1)[0])
