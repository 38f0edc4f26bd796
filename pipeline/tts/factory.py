"""From a persona's ``Voice`` to a working TTS backend, falling back along a configured order."""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable

from pipeline.persona.persona import Voice
from pipeline.tts.base import TTSBackend, TTSError

log = logging.getLogger(__name__)

Resolver = Callable[[str], Path]  # a voice spec (packaged name, hub name, path) -> local path
DEFAULT_FALLBACK = ("piper", "flite", "espeak")


def _as_path(spec: str) -> Path:
    return Path(spec).expanduser()


def _build(backend: str, voice: Voice, resolve: Resolver) -> TTSBackend:
    if backend == "piper":
        from pipeline.tts.piper_tts import PiperTTS

        return PiperTTS(resolve(voice.voice) if voice.backend == "piper" else resolve("piper-en_US-joe-medium"),
                        variation=voice.variation)
    if backend == "coqui":
        from pipeline.tts.coqui_tts import CoquiTTS

        return CoquiTTS(voice.voice)
    if backend in ("flite", "espeak"):
        from pipeline.tts.command_tts import CommandTTS

        return CommandTTS(backend, voice.voice if voice.backend == backend else None)
    raise TTSError(f"unknown TTS backend {backend!r}")


def create_tts(voice: Voice, resolve: Resolver | None = None,
               fallback: tuple[str, ...] = DEFAULT_FALLBACK) -> TTSBackend:
    """The persona's backend if it loads, else the first of ``fallback`` that does.

    ``resolve`` turns the voice spec into a file (the app passes ``model_store.resolve``); without
    it the spec must already be a path. Raises TTSError only when nothing at all can speak.
    """
    resolve = resolve or _as_path
    order = [voice.backend] + [b for b in fallback if b != voice.backend]
    problems = []
    for backend in order:
        try:
            tts = _build(backend, voice, resolve)
        except Exception as error:  # a broken voice must never leave the assistant mute
            problems.append(f"{backend}: {error}")
            log.warning("TTS backend %s unavailable (%s); trying the next", backend, error)
            continue
        if backend != voice.backend:
            log.warning("speaking with %s instead of %s", backend, voice.backend)
        return tts
    raise TTSError("no TTS backend could load: " + "; ".join(problems))


class TTSProvider:
    """Creates a backend per distinct voice and keeps it: the pipeline asks at every turn (the
    persona may have changed) and loading a voice costs ~0.2 s."""

    def __init__(self, resolve: Resolver | None = None, fallback: tuple[str, ...] = DEFAULT_FALLBACK):
        self.resolve = resolve
        self.fallback = fallback
        self._cache: dict[tuple[str, str, float], TTSBackend] = {}
        self._lock = threading.Lock()

    def __call__(self, voice: Voice) -> TTSBackend:
        # speaking_rate is applied per call; a variation of its own is another Piper instance
        key = (voice.backend, voice.voice, voice.variation)
        with self._lock:
            if key not in self._cache:
                self._cache[key] = create_tts(voice, self.resolve, self.fallback)
            return self._cache[key]
