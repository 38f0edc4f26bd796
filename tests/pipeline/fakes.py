"""Small stand-ins for the LLM backend, so pipeline mechanics are tested in milliseconds."""
from __future__ import annotations

import threading
import time
from typing import Iterator


class FakeCompletion:
    """Yields the scripted reply word by word; counts itself as an active engine slot until done."""

    def __init__(self, backend: "FakeBackend", reply: str, error: Exception | None):
        self.backend = backend
        self.reply = reply
        self.error = error
        self.cancelled = threading.Event()
        with backend.lock:
            backend.active += 1

    def __iter__(self) -> Iterator[str]:
        try:
            if self.error is not None:
                raise self.error
            for i, word in enumerate(self.reply.split(" ")):
                if self.cancelled.is_set():
                    return
                time.sleep(self.backend.delay_s)
                yield word if i == 0 else " " + word
        finally:
            self._release()

    def _release(self) -> None:
        with self.backend.lock:
            if not getattr(self, "_released", False):
                self._released = True
                self.backend.active -= 1

    def cancel(self) -> None:
        self.cancelled.set()


class FakeBackend:
    """An LLMBackend with scripted replies. ``errors`` holds exceptions for the next calls."""

    name = "fake"

    def __init__(self, replies: list[str] | None = None, delay_s: float = 0.005):
        self.replies = list(replies or ["Hello there. This is a scripted answer for the test."])
        self.errors: list[Exception | None] = []
        self.delay_s = delay_s
        self.calls: list[list[dict]] = []
        self.active = 0
        self.lock = threading.Lock()

    def generate(self, messages, sampling, session=None) -> FakeCompletion:
        self.calls.append(messages)
        reply = self.replies[min(len(self.calls) - 1, len(self.replies) - 1)]
        error = self.errors.pop(0) if self.errors else None
        return FakeCompletion(self, reply, error)

    def count_tokens(self, messages) -> int:
        return sum(len(m["content"].split()) + 4 for m in messages)

    @property
    def context_length(self) -> int:
        return 2048

    def close(self) -> None:
        pass


class SilentTTS:
    """A TTS that returns one buffer of N samples per word (fast, deterministic)."""

    name = "silent"
    sample_rate = 16000

    def __init__(self, samples_per_word: int = 1600, fail_on: str | None = None):
        self.samples_per_word = samples_per_word
        self.fail_on = fail_on

    def synthesize(self, text, speaking_rate=1.0, cancel=None):
        import numpy as np

        if self.fail_on and self.fail_on in text:
            raise RuntimeError("synthetic TTS failure")
        yield np.full(self.samples_per_word * len(text.split()), 100, np.int16)
