"""Silero VAD (ONNX) on 32 ms frames: one speech probability per 512 samples at 16 kHz.

Called through onnxruntime directly (numpy in, numpy out): no torch on the audio thread. The
model (``SileroModel``, ~10-14 MB of RAM once loaded) is shared by every session; each audio
stream keeps only its own recurrent state (``SileroVAD``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

FRAME_SAMPLES = 512  # 32 ms at 16 kHz: the only size Silero v5+ accepts at this rate
_CONTEXT = 64  # Silero prepends the last 64 samples of the previous frame


class SileroModel:
    """The loaded ONNX model. Stateless (the state travels in and out of each call), so one
    instance serves every session; onnxruntime's ``run`` is thread-safe."""

    def __init__(self, model_path: str | Path):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1  # 0.2 ms per frame: more threads only add contention
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = onnxruntime.InferenceSession(str(model_path), sess_options=options,
                                                    providers=["CPUExecutionProvider"])


class SileroVAD:
    """One audio stream's VAD: the shared model plus this stream's recurrent state."""

    def __init__(self, model: SileroModel | str | Path):
        self.model = model if isinstance(model, SileroModel) else SileroModel(model)
        self._sr = np.array(16000, dtype=np.int64)
        self.reset()

    def reset(self) -> None:
        self._state = np.zeros((2, 1, 128), np.float32)
        self._context = np.zeros((1, _CONTEXT), np.float32)

    def __call__(self, frame: np.ndarray) -> float:
        """Speech probability of one 512-sample float32 frame."""
        x = np.concatenate([self._context, frame.reshape(1, FRAME_SAMPLES).astype(np.float32)], axis=1)
        out, self._state = self.model.session.run(None, {"input": x, "state": self._state, "sr": self._sr})
        self._context = x[:, -_CONTEXT:]
        return float(out.reshape(-1)[0])
