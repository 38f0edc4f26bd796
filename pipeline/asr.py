"""Speech recognition with faster-whisper (CTranslate2, int8 on CPU), guarded against phantoms."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.asr_guard import Segment, keep_segments
from pipeline.config import ASRConfig


@dataclass
class ASRResult:
    """The guarded text of one buffer, and what was dropped (for logs and tests)."""

    text: str
    segments: list[Segment] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


class WhisperTranscriber:
    """One loaded Whisper model; may be shared by many sessions (calls are serialized: two
    concurrent decodes on 2 cores would each take twice as long and both be late)."""

    def __init__(self, model_dir: str | Path, config: ASRConfig | None = None):
        from faster_whisper import WhisperModel

        self.config = config or ASRConfig()
        self.model = WhisperModel(str(model_dir), device="cpu", compute_type=self.config.compute_type,
                                  cpu_threads=self.config.cpu_threads, local_files_only=True)
        self.is_english_only = bool(getattr(self.model, "model", None) and not self.model.model.is_multilingual)
        self._lock = threading.Lock()

    def transcribe(self, audio: np.ndarray, language: str | None = "en") -> ASRResult:
        """``audio``: 16 kHz mono float32. Greedy (or beam) decoding, no timestamps, no context."""
        if len(audio) < 1600:  # under 0.1 s: nothing a person says fits
            return ASRResult("")
        with self._lock:
            segments, _ = self.model.transcribe(
                audio.astype(np.float32, copy=False),
                language=None if self.is_english_only else language,
                beam_size=self.config.beam_size,
                temperature=0.0,  # no temperature fallback: it re-decodes exactly the doubtful cases, slowly
                without_timestamps=True,
                condition_on_previous_text=False,
                vad_filter=False,  # our own VAD already cut the turn
                no_speech_threshold=None,  # the guard below applies it (and says why it dropped)
                log_prob_threshold=None,
            )
            found = [Segment(s.text, s.no_speech_prob, s.avg_logprob, s.compression_ratio) for s in segments]
        text, dropped = keep_segments(found, self.config)
        return ASRResult(text, found, dropped)
