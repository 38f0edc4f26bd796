"""``TokenStream``: the text deltas of one request, readable from a thread or from asyncio."""
from __future__ import annotations

import asyncio
import queue
import time
from typing import AsyncIterator, Callable, Iterator

_END = object()


class TokenStream:
    """Iterate (``for delta in stream``) or ``async for delta in stream``; ``cancel()`` from anywhere.

    The engine thread ``put``s deltas and finally ``close``s; after the end ``finish_reason`` is one
    of "stop", "length", "cancelled", "error" ("probed" for a probe), and ``output_ids``/``ttft_s`` describe the answer.
    """

    def __init__(self, request_id: int, cancel: Callable[[int], None], hold: Callable[[int, bool], None] | None = None):
        self.request_id = request_id
        self._cancel = cancel
        self._hold = hold
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.finish_reason: str | None = None
        self.output_ids: list[int] = []
        self.prompt_tokens = 0
        self.cached_tokens = 0  # prompt tokens found in the session's slot (not recomputed)
        self.ttft_s: float | None = None
        self.first_token_at: float | None = None  # perf_counter() stamps, for throughput figures
        self.finished_at: float | None = None
        self.error: BaseException | None = None
        self.probe: float | None = None  # a probe request's P(next token in probe_ids), set before the end
        self.on_probe: Callable[[float], None] | None = None  # called with it (engine thread), see LLMEngine.submit

    # -- engine side --
    def put(self, delta: str) -> None:
        self._queue.put(delta)

    def close(self, reason: str, error: BaseException | None = None) -> None:
        self.finish_reason, self.error = reason, error
        self.finished_at = time.perf_counter()
        self._queue.put(_END)

    # -- consumer side --
    def cancel(self) -> None:
        self._cancel(self.request_id)

    def hold(self) -> None:
        """No more tokens after the next step's until ``release()`` (the request keeps its slot)."""
        if self._hold is not None:
            self._hold(self.request_id, True)

    def release(self) -> None:
        """A held request (``hold()``, or submitted with ``hold_after``) writes on (otherwise: no effect)."""
        if self._hold is not None:
            self._hold(self.request_id, False)

    def __iter__(self) -> Iterator[str]:
        while (item := self._queue.get()) is not _END:
            yield item
        self._queue.put(_END)  # a second iteration ends at once instead of blocking
        if self.error is not None:
            raise self.error

    async def _aiter(self) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        while (item := await loop.run_in_executor(None, self._queue.get)) is not _END:
            yield item
        self._queue.put(_END)
        if self.error is not None:
            raise self.error

    def __aiter__(self) -> AsyncIterator[str]:
        return self._aiter()

    def text(self) -> str:
        """Block until the end and return the whole answer."""
        return "".join(self)
