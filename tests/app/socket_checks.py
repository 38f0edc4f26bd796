"""Checks shared by the front-end tests that talk to a server over a real socket: the protocol's
first steps, reading a turn, and waiting until a server is back to its idle baseline (no session,
pipeline, generation, held LLM slot or per-session thread left)."""
from __future__ import annotations

import json
import logging
import threading
import time

import pytest
from websockets.exceptions import ConnectionClosed

PROCESS_WIDE_THREADS = ("asyncio_", "AnyIO worker thread", "tqdm_monitor", "voxlane-v1")


def num_threads() -> int:
    """Threads, leaving out bounded, reused pools and process-wide singletons (the event loop's,
    AnyIO's and /v1's worker pools, tqdm's monitor): what is left is per session."""
    return sum(not t.name.startswith(PROCESS_WIDE_THREADS) for t in threading.enumerate())


def wait_idle(server, baseline_threads: int | None = None, timeout_s: float = 30.0) -> None:
    """No session, no pipeline, no generation, no held LLM slot, and no more threads than before."""
    deadline = time.monotonic() + timeout_s
    factory = server.factory
    while time.monotonic() < deadline:
        threads_ok = baseline_threads is None or num_threads() <= baseline_threads
        if (server.registry.num_open == 0 and not factory.open_pipelines and factory.llm.active == 0
                and not factory.llm.sessions and threads_ok):
            return
        time.sleep(0.02)
    raise AssertionError(f"not idle: sessions {server.registry.num_open}, pipelines {len(factory.open_pipelines)}, "
                         f"generations {factory.llm.active}, slots {factory.llm.sessions}, "
                         f"threads {sorted(t.name for t in threading.enumerate())}")


def wait_sessions_closed(server, baseline_threads: int | None = None, timeout_s: float = 60.0) -> None:
    """For a server on real models (PipelineSessions): no session, no pipeline, and no more
    threads than ``baseline_threads``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (server.registry.num_open == 0 and server.factory.num_open == 0
                and (baseline_threads is None or num_threads() <= baseline_threads)):
            return
        time.sleep(0.05)
    raise AssertionError(f"still open: {server.registry.num_open} sessions, {server.factory.num_open} pipelines; "
                         f"threads {sorted(t.name for t in threading.enumerate())} (baseline {baseline_threads})")


def start(ws, timeout_s: float = 30.0, **extra) -> dict:
    """Sends "start" (16 kHz unless ``extra`` says otherwise) and returns the "ready" answer."""
    ws.send(json.dumps({"type": "start", "version": 1, "sample_rate": 16000, **extra}))
    ready = json.loads(ws.recv(timeout=timeout_s))
    assert ready["type"] == "ready", ready
    return ready


def next_error(ws, timeout_s: float = 15.0) -> dict:
    """The next error message (state, vad and other messages on the way are skipped)."""
    deadline = time.monotonic() + timeout_s
    while True:
        message = ws.recv(timeout=max(0.1, deadline - time.monotonic()))
        if isinstance(message, str) and (data := json.loads(message))["type"] == "error":
            return data


def turn(ws, text: str = "ping") -> list[dict]:
    """A typed turn, to its own "turn" message; the JSON messages on the way (a spoken notice's
    turn that was still finishing included)."""
    ws.send(json.dumps({"type": "text", "text": text}))
    return read_turn(ws, text)


def read_turn(ws, text: str | None = None, timeout_s: float = 30.0) -> list[dict]:
    """The JSON messages up to the "turn" message of the turn whose final transcript is ``text``
    (of the next turn of any kind when None); audio PCM frames are skipped. ``timeout_s``: the
    longest wait for one message."""
    seen, gen = [], None
    while True:
        message = ws.recv(timeout=timeout_s)
        if isinstance(message, bytes):
            continue
        seen.append(data := json.loads(message))
        if data["type"] == "transcript" and data["final"] and data["text"] == text:
            gen = data["gen"]
        if data["type"] == "turn" and (text is None or data["gen"] == gen):
            return seen


def assert_normal_turn(ws) -> list[dict]:
    """A typed "ping" is answered (echoed, spoken, no error); returns the turn's messages."""
    seen = turn(ws, "ping")
    own = [m for m in seen if m.get("gen") == seen[-1]["gen"]]
    reply = "".join(m["text"] for m in own if m["type"] == "assistant_delta")
    assert reply == "You said: ping.", seen
    assert not [m for m in own if m["type"] == "error"], seen
    assert any(m["type"] == "audio" for m in own)
    return own


def closed_with(ws) -> int:
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            ws.recv(timeout=30)
    return closed.value.rcvd.code if closed.value.rcvd else None


class LogLines(logging.Handler):
    """Every record's message, for tests that attach it to a logger (after the server's uvicorn
    config is built: it replaces its loggers' handlers)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
