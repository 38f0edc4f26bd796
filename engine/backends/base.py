"""The small interface between the voice pipeline and whatever generates text.

Implementations: ``engine.backends.engine_backend.EngineBackend`` (our own engine, the default),
``engine.backends.reference.TransformersBackend`` (transformers ``generate``; the reference the engine
is checked and benchmarked against) and, for scale-out, a remote OpenAI-compatible server.
"""
from __future__ import annotations

from typing import Iterator, Protocol, runtime_checkable

from engine.sampling_params import SamplingParams

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": "..."}


@runtime_checkable
class Completion(Protocol):
    """One streaming answer: iterate for text deltas (each valid UTF-8 text); ``cancel()`` from any
    thread ends the stream at the next token and frees what the generation held."""

    def __iter__(self) -> Iterator[str]: ...

    def cancel(self) -> None: ...


@runtime_checkable
class LLMBackend(Protocol):
    """Generates assistant text for a chat. ``session`` lets a backend keep per-conversation state
    (our engine keeps the conversation's KV cache so a new turn prefills only its new tokens)."""

    name: str

    def generate(self, messages: list[Message], sampling: SamplingParams, session: str | None = None) -> Completion: ...

    def count_tokens(self, messages: list[Message]) -> int: ...

    @property
    def context_length(self) -> int: ...

    def close(self) -> None: ...
