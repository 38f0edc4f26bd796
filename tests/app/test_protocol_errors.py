"""The protocol's rules over a real socket, with a scripted conversation instead of models (fast):
malformed messages get error codes, limits hold, and a session that ends frees its place."""
from __future__ import annotations

import json
import queue
import threading
import time

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from app.config import AppConfig, ServerConfig
from app.server.app import create_app
from app.server.runner import BackgroundServer
from pipeline import frames as f


class ScriptedConversation:
    """Answers every typed turn with two words and two 0.1 s tones; records what it was told."""

    def __init__(self, persona: str):
        self.persona = persona
        self.out: queue.Queue = queue.Queue()
        self.gen = 0
        self.audio_samples = 0
        self.reports: list[tuple[int, int]] = []
        self.is_closed = False

    def push_audio(self, pcm, sample_rate_hz, block=True):
        self.audio_samples += len(pcm)
        return True

    def text_input(self, text):
        self.gen += 1
        tone = (8000 * np.sin(np.arange(1600) / 5)).astype(np.int16)
        for frame in (f.Interrupt(self.gen, reason="text"), f.TextDelta(self.gen, text="echo: "),
                      f.TextDelta(self.gen, text=text), f.AudioOut(self.gen, pcm=tone, sample_rate=16000),
                      f.AudioOut(self.gen, pcm=tone, sample_rate=16000, start_sample=1600),
                      f.TurnDone(self.gen, waterfall={"gen": self.gen, "ms": {"text_in": 0.0}})):
            self.out.put(frame)

    def interrupt(self, reason="user"):
        self.gen += 1
        self.out.put(f.Interrupt(self.gen, reason=reason))

    def set_persona(self, name):
        self.persona = name

    def report_playback(self, gen, played_samples):
        self.reports.append((gen, played_samples))

    def next_frame(self, timeout_s):
        try:
            return self.out.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def close(self):
        self.is_closed = True


class ScriptedFactory:
    def __init__(self):
        self.opened: list[ScriptedConversation] = []
        self.lock = threading.Lock()

    def persona_names(self):
        return ["nova", "pirate"]

    def default_persona(self):
        return "nova"

    def open(self, persona, session_id):
        conversation = ScriptedConversation(persona)
        with self.lock:
            self.opened.append(conversation)
        return conversation

    def close(self):
        pass


@pytest.fixture(scope="module")
def server():
    config = AppConfig(server=ServerConfig(max_sessions=2, max_message_bytes=4096))
    factory = ScriptedFactory()
    app = create_app(config, factory, with_ui=False)
    with BackgroundServer(app, max_message_bytes=4096) as running:
        running.factory, running.registry = factory, app.state.registry
        yield running


def _wait_all_closed(registry, timeout_s: float = 30.0) -> None:
    """A session's place is given back after its pipeline has stopped, a moment after the socket
    closes: wait for that, so each test starts with every place free."""
    deadline = time.monotonic() + timeout_s
    while registry.num_open and time.monotonic() < deadline:
        time.sleep(0.02)
    assert registry.num_open == 0


@pytest.fixture(autouse=True)
def _all_places_free(server):
    _wait_all_closed(server.registry)


def _start(ws, **extra) -> dict:
    ws.send(json.dumps({"type": "start", "version": 1, "sample_rate": 16000, **extra}))
    return json.loads(ws.recv(timeout=30))


def _until(ws, kind: str) -> list[dict | bytes]:
    seen = []
    while True:
        message = ws.recv(timeout=30)
        seen.append(message if isinstance(message, bytes) else json.loads(message))
        if isinstance(seen[-1], dict) and seen[-1]["type"] == kind:
            return seen


def test_ready_then_a_typed_turn_with_audio(server):
    with connect(server.ws_url) as ws:
        ready = _start(ws, persona="pirate")
        assert ready["type"] == "ready" and ready["version"] == 1 and ready["persona"] == "pirate"
        ws.send(json.dumps({"type": "text", "text": "hi"}))
        seen = _until(ws, "turn")
    deltas = "".join(m["text"] for m in seen if isinstance(m, dict) and m["type"] == "assistant_delta")
    assert deltas == "echo: hi"
    headers = [m for m in seen if isinstance(m, dict) and m["type"] == "audio"]
    pcm = [m for m in seen if isinstance(m, bytes)]
    assert len(headers) == len(pcm) == 2 and all(len(b) == 2 * h["samples"] for h, b in zip(headers, pcm))
    states = [m["state"] for m in seen if isinstance(m, dict) and m["type"] == "state"]
    assert "thinking" in states and "speaking" in states and states[-1] == "listening"


@pytest.mark.parametrize("message, code", [
    ("not json", "bad_json"),
    ("[1, 2]", "bad_json"),
    (json.dumps({"type": "dance"}), "bad_message"),
    (json.dumps({"type": "text"}), "bad_message"),
    (json.dumps({"type": "text", "text": 5}), "bad_message"),
    (json.dumps({"type": "played", "gen": -1, "samples": 3}), "bad_message"),
    (json.dumps({"type": "persona", "persona": "nobody"}), "unknown_persona"),
    (json.dumps({"type": "start", "sample_rate": 16000}), "already_started"),
    (b"\x01\x02\x03", "bad_audio"),
])
def test_malformed_messages_get_a_code_and_the_session_goes_on(server, message, code):
    with connect(server.ws_url) as ws:
        _start(ws)
        ws.send(message)
        error = json.loads(ws.recv(timeout=30))
        assert error["type"] == "error" and error["code"] == code and error["fatal"] is False
        ws.send(json.dumps({"type": "text", "text": "still there?"}))
        assert any(isinstance(m, dict) and m["type"] == "assistant_delta" for m in _until(ws, "turn"))


@pytest.mark.parametrize("first, code", [
    (json.dumps({"type": "text", "text": "hello"}), "not_started"),
    (b"\x00\x00", "not_started"),
    (json.dumps({"type": "start", "sample_rate": 100}), "bad_message"),
    (json.dumps({"type": "start", "sample_rate": 16000, "persona": "nobody"}), "unknown_persona"),
])
def test_messages_before_a_valid_start_are_refused(server, first, code):
    with connect(server.ws_url) as ws:
        ws.send(first)
        assert json.loads(ws.recv(timeout=30))["code"] == code
        assert _start(ws)["type"] == "ready"  # a valid start still works afterwards


def _closed_with(ws, code: str) -> int:
    error = json.loads(ws.recv(timeout=30))
    assert error["code"] == code and error["fatal"] is True
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=30)
    return closed.value.rcvd.code


def test_unsupported_version_closes(server):
    with connect(server.ws_url) as ws:
        ws.send(json.dumps({"type": "start", "version": 99, "sample_rate": 16000}))
        assert _closed_with(ws, "unsupported_version") == 4000


def test_message_above_the_limit_closes_1009(server):
    with connect(server.ws_url) as ws:
        _start(ws)
        ws.send(b"\x00" * 6000)  # above max_message_bytes = 4096
        assert _closed_with(ws, "message_too_large") == 1009
    assert server.factory.opened[-1].is_closed


def test_foreign_origin_is_refused(server):
    with connect(server.ws_url, origin="http://evil.example") as ws:
        assert _closed_with(ws, "forbidden_origin") == 4003
    with connect(server.ws_url, origin=server.url) as ws:  # the page's own origin is fine
        assert _start(ws)["type"] == "ready"


def test_session_cap_answers_busy_and_frees_places(server):
    with connect(server.ws_url) as a, connect(server.ws_url) as b:
        _start(a), _start(b)
        with connect(server.ws_url) as c:
            c.send(json.dumps({"type": "start", "sample_rate": 16000}))
            assert _closed_with(c, "busy") == 1013
    _wait_all_closed(server.registry)  # both places come back once the sockets close
    with connect(server.ws_url) as a, connect(server.ws_url) as b:
        assert _start(a)["type"] == _start(b)["type"] == "ready"


def test_audio_frames_and_playback_reports_reach_the_conversation(server):
    with connect(server.ws_url) as ws:
        _start(ws)
        for _ in range(5):
            ws.send(np.zeros(320, "<i2").tobytes())
        ws.send(json.dumps({"type": "played", "gen": 1, "samples": 800}))
        ws.send(json.dumps({"type": "end"}))
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=30)
    conversation = server.factory.opened[-1]
    assert conversation.audio_samples == 5 * 320 and conversation.reports == [(1, 800)]
    assert conversation.is_closed


def test_access_token_is_required_when_configured():
    config = AppConfig(server=ServerConfig(access_token="s3cret-s3cret-s3cret"))
    with BackgroundServer(create_app(config, ScriptedFactory(), with_ui=False)) as running:
        with connect(running.ws_url) as ws:
            ws.send(json.dumps({"type": "start", "sample_rate": 16000, "token": "wrong"}))
            assert _closed_with(ws, "unauthorized") == 4001
        with connect(running.ws_url) as ws:
            assert _start(ws, token="s3cret-s3cret-s3cret")["type"] == "ready"
        with connect(running.ws_url + "?token=s3cret-s3cret-s3cret") as ws:
            assert _start(ws)["type"] == "ready"
