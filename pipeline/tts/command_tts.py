"""Speech from Debian command-line synthesizers (flite, espeak-ng): no weights, always there,
so they are the fallback when a neural voice cannot load."""
from __future__ import annotations

import shutil
import subprocess
from typing import Iterator

import numpy as np

from pipeline.tts.base import Cancel, TTSError, pcm16_from_wav_bytes


class CommandTTS:
    """One sentence in, one WAV out of a subprocess. ``kind`` is ``"flite"`` or ``"espeak"``."""

    ESPEAK_WPM = 175  # espeak-ng's default words per minute: speaking_rate 1.0

    def __init__(self, kind: str = "flite", voice: str | None = None, timeout_s: float = 30.0):
        if kind not in ("flite", "espeak"):
            raise TTSError(f"unknown command TTS {kind!r}")
        self.kind = kind
        self.name = kind
        self.program = shutil.which("flite" if kind == "flite" else "espeak-ng")
        if self.program is None:
            raise TTSError(f"{kind} is not installed (apt-get install {'flite' if kind == 'flite' else 'espeak-ng'})")
        # flite's built-in default (kal) is 8 kHz telephone quality; kal16 is the same voice at 16 kHz.
        self.voice = voice or ("kal16" if kind == "flite" else None)
        self.timeout_s = timeout_s
        try:
            self.sample_rate = self._probe_rate()
        except TTSError:
            if self.voice is None:
                raise
            # An unknown voice name (or a neural model's name left in the persona): the default voice
            # still speaks, which is what a fallback is for.
            self.voice = None
            self.sample_rate = self._probe_rate()

    def _command(self, text: str, speaking_rate: float) -> list[str]:
        if self.kind == "flite":
            cmd = [self.program, "--setf", f"duration_stretch={1.0 / speaking_rate:.3f}"]
            if self.voice:
                cmd += ["-voice", self.voice]
            return cmd + ["-t", text, "-o", "/dev/stdout"]
        cmd = [self.program, "--stdout", "-s", str(round(self.ESPEAK_WPM * speaking_rate))]
        if self.voice:
            cmd += ["-v", self.voice]
        return cmd + ["--", text]

    def _run(self, text: str, speaking_rate: float, cancel: Cancel | None = None) -> tuple[np.ndarray, int] | None:
        """The WAV the command writes; None when ``cancel`` killed it first."""
        try:
            process = subprocess.Popen(self._command(text, speaking_rate), stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE)
        except OSError as error:
            raise TTSError(f"{self.kind} failed: {error}") from error
        if cancel is not None:
            cancel.on_cancel(process.kill)  # Popen.kill is a no-op once the process has been reaped
        try:
            out, err = process.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired as error:
            process.kill()
            process.communicate()
            raise TTSError(f"{self.kind} failed: {error}") from error
        if cancel is not None and cancel.is_cancelled:
            return None
        if process.returncode != 0:
            raise TTSError(f"{self.kind} exited {process.returncode}: {err.decode(errors='replace')[:200]}")
        return pcm16_from_wav_bytes(out)

    def _probe_rate(self) -> int:
        # The rate depends on the voice (flite's kal is 8 kHz, espeak-ng is 22,050 Hz): ask once.
        return self._run("a", 1.0)[1]

    def synthesize(self, text: str, speaking_rate: float = 1.0, cancel: Cancel | None = None) -> Iterator[np.ndarray]:
        if not text.strip():
            return
        result = self._run(text, speaking_rate, cancel)
        if result is not None:
            yield result[0]
