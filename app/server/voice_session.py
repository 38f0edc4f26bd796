"""What a server session needs from the voice pipeline, and the factory that makes one per session.

The server never touches stages or models: it pushes input in, pulls output frames out, and
closes. ``PipelineSessions`` (app/pipeline_sessions.py) is the real implementation on
pipeline.Pipeline; tests may pass any object with the same methods.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from pipeline.frames import Frame


class VoiceSession(Protocol):
    """One user's conversation: a running pipeline with its own history and turn counter."""

    def push_audio(self, pcm: np.ndarray, sample_rate_hz: int, block: bool = True) -> bool:
        """Mono int16 microphone samples at the client's rate (resampled inside, once). With
        ``block=False`` it never waits: False when the pipeline's input is full (the piece is dropped)."""

    def text_input(self, text: str) -> None: ...

    def interrupt(self, reason: str = "user") -> None:
        """Stop the assistant now; ``reason`` is "user" (the client asked) or "timeout" (a stalled turn)."""

    def speak_notice(self, text: str) -> None:
        """Stop the assistant and say ``text`` in its voice instead, as a turn of its own (the
        spoken apology for a stalled turn)."""

    def set_persona(self, name: str) -> None:
        """Talk as ``name`` from the next turn on; raises KeyError for an unknown persona."""

    def report_playback(self, gen: int, played_samples: int) -> None:
        """The client has played this much of turn ``gen``'s audio (what the user heard)."""

    def next_frame(self, timeout_s: float) -> Frame | None:
        """The next output frame, or None after ``timeout_s`` (or once closed)."""

    def close(self) -> None:
        """Stop every thread and free the LLM slot; idempotent."""


class VoiceSessionFactory(Protocol):
    """Shared, loaded-once models, and a new VoiceSession per session."""

    def persona_names(self) -> list[str]: ...

    def default_persona(self) -> str: ...

    def open(self, persona: str, session_id: str) -> VoiceSession:
        """A new session's pipeline, known by ``session_id`` everywhere (the registry's id: also the
        LLM session that keeps its KV slot); raises KeyError for an unknown persona."""

    def close(self) -> None: ...
