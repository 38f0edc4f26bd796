"""A remote OpenAI-compatible server as the LLM backend (vLLM, llama.cpp server, Ollama, or another
``voxlane serve``): how Voxlane scales out — many voice front ends, one serving cluster.

Streaming over SSE; retries with exponential backoff on connection errors and 429/5xx *before the
first token* (after text was spoken a retry would repeat it, so then the error ends the turn);
``cancel()`` closes the stream so the server stops generating.
"""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Iterator

import httpx

from engine.backends.base import Message
from engine.sampling_params import SamplingParams
from engine.stop_strings import StopStringFilter

log = logging.getLogger(__name__)

RETRYABLE_STATUS = {429, 500, 502, 503, 504}


class RemoteError(RuntimeError):
    """The remote server failed in a way retries did not fix (or after text was already streamed)."""


@dataclass(frozen=True)
class RemoteSettings:
    """Where the server is and how patient to be with it."""

    base_url: str  # ".../v1"
    model: str = ""
    api_key: str = ""
    timeout_s: float = 30.0
    max_retries: int = 3
    backoff_s: float = 0.25  # first retry delay; doubles each time, capped at 4 s
    context_length: int = 8192


class RemoteCompletion:
    """One streamed chat completion; iterate for text deltas, ``cancel()`` from any thread."""

    def __init__(self, backend: "RemoteBackend", messages: list[Message], sampling: SamplingParams):
        self._backend = backend
        self._body = backend.request_body(messages, sampling)
        self._stop = StopStringFilter(sampling.stop)
        self._cancelled = threading.Event()
        self._response: httpx.Response | None = None

    def __iter__(self) -> Iterator[str]:
        settings = self._backend.settings
        attempt, started = 0, False
        while not self._cancelled.is_set():
            try:
                for delta in self._stream_once():
                    started = True
                    text, done = self._stop.feed(delta)
                    if text:
                        yield text
                    if done:
                        return
                if tail := self._stop.flush():
                    yield tail
                return
            except (httpx.TransportError, _Retryable) as error:
                if self._cancelled.is_set():
                    return
                if started or attempt >= settings.max_retries:
                    raise RemoteError(f"{settings.base_url}: {error}") from error
                delay = min(4.0, settings.backoff_s * 2 ** attempt)
                if isinstance(error, _Retryable) and error.retry_after is not None:
                    delay = min(30.0, error.retry_after)
                attempt += 1
                log.warning("remote LLM failed before the first token (%s); retry %d in %.2f s", error, attempt, delay)
                self._cancelled.wait(delay)
            finally:
                self._close()

    def _stream_once(self) -> Iterator[str]:
        client = self._backend.client
        request = client.build_request("POST", "/chat/completions", json=self._body)
        self._response = response = client.send(request, stream=True)
        if response.status_code in RETRYABLE_STATUS:
            retry_after = response.headers.get("retry-after")
            raise _Retryable(f"HTTP {response.status_code}", float(retry_after) if retry_after else None)
        if response.status_code != 200:
            body = response.read().decode(errors="replace")[:300]
            raise RemoteError(f"{self._backend.settings.base_url}: HTTP {response.status_code}: {body}")
        for line in response.iter_lines():
            if self._cancelled.is_set():
                return
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            try:
                chunk = json.loads(data)
            except json.JSONDecodeError as error:
                raise RemoteError(f"malformed event from the server: {data[:200]!r}") from error
            if "error" in chunk:
                raise RemoteError(f"the server reported: {chunk['error']}")
            for choice in chunk.get("choices", []):
                if content := (choice.get("delta") or {}).get("content"):
                    yield content
        if not self._cancelled.is_set():
            # A connection that closes before [DONE] is a truncated answer, not a finished one.
            raise _Retryable("the stream ended before [DONE]", None)

    def _close(self) -> None:
        response, self._response = self._response, None
        if response is not None:
            response.close()

    def cancel(self) -> None:
        self._cancelled.set()
        self._close()  # closing the connection is how an OpenAI-compatible server learns to stop


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None):
        super().__init__(message)
        self.retry_after = retry_after


class RemoteBackend:
    """LLM backend on any OpenAI-compatible ``/v1/chat/completions`` endpoint."""

    name = "openai"

    def __init__(self, settings: RemoteSettings):
        self.settings = settings
        headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        self.client = httpx.Client(base_url=settings.base_url.rstrip("/"), headers=headers,
                                   timeout=httpx.Timeout(settings.timeout_s, connect=min(5.0, settings.timeout_s)))

    def request_body(self, messages: list[Message], sampling: SamplingParams) -> dict:
        body = {"model": self.settings.model, "messages": messages, "stream": True,
                "max_tokens": sampling.max_tokens, "temperature": sampling.temperature, "top_p": sampling.top_p}
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.top_k:
            body["top_k"] = sampling.top_k  # vLLM, llama.cpp and Voxlane accept it; OpenAI ignores it
        if sampling.repetition_penalty != 1.0:
            body["repetition_penalty"] = sampling.repetition_penalty
        if sampling.dry_multiplier:  # llama.cpp's server and Voxlane apply DRY; others ignore the keys
            body.update(dry_multiplier=sampling.dry_multiplier, dry_base=sampling.dry_base,
                        dry_allowed_length=sampling.dry_allowed_length)
        if sampling.stop:
            body["stop"] = list(sampling.stop)[:4]
        return body

    def generate(self, messages: list[Message], sampling: SamplingParams, session: str | None = None) -> RemoteCompletion:
        return RemoteCompletion(self, messages, sampling)

    def count_tokens(self, messages: list[Message]) -> int:
        # No tokenizer for a remote model: ~4 characters a token plus per-message framing, erring high.
        return sum(len(m["content"]) // 3 + 4 for m in messages)

    @property
    def context_length(self) -> int:
        return self.settings.context_length

    def close(self) -> None:
        self.client.close()
