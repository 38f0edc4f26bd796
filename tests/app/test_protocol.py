"""The WebSocket protocol with the real pipeline (Whisper, SmolLM2, Piper) over a real socket:
a spoken turn from a WAV, interrupting mid-answer, two sessions at once, and a client that
vanishes mid-answer. One server (and one set of models) for the whole module."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import threading
import time

import numpy as np
import pytest
from websockets.sync.client import connect

from app.client import one_turn
from app.config import AppConfig
from app.server.app import create_app
from app.server.pipeline_conversations import PipelineConversations
from app.server.runner import BackgroundServer

pytestmark = pytest.mark.slow
BACKEND = os.environ.get("VOXLANE_TEST_BACKEND", "transformers")


@pytest.fixture(scope="module")
def server():
    factory = PipelineConversations(AppConfig(), BACKEND)
    factory.warm_up()
    app = create_app(AppConfig(), factory, with_ui=False)
    with BackgroundServer(app) as running:
        running.factory, running.registry = factory, app.state.registry
        yield running
    factory.close()


@pytest.fixture(scope="module")
def question_wav(tmp_path_factory):
    if not shutil.which("espeak-ng"):
        pytest.skip("espeak-ng is needed to speak the test question")
    path = tmp_path_factory.mktemp("protocol") / "question.wav"
    subprocess.run(["espeak-ng", "-s", "150", "-w", str(path), "What is the capital of France?"], check=True)
    return path


def _wait_idle(server, baseline_threads: int | None = None, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        threads_ok = baseline_threads is None or threading.active_count() <= baseline_threads
        if server.registry.num_open == 0 and server.factory.num_open == 0 and threads_ok:
            return
        time.sleep(0.05)
    names = sorted(t.name for t in threading.enumerate())
    raise AssertionError(f"still open: {server.registry.num_open} sessions, {server.factory.num_open} pipelines; "
                         f"threads {names}")


def _start(ws, **extra) -> dict:
    ws.send(json.dumps({"type": "start", "version": 1, "sample_rate": 16000, **extra}))
    ready = json.loads(ws.recv(timeout=60))
    assert ready["type"] == "ready", ready
    return ready


def test_a_spoken_turn_from_a_wav(server, question_wav):
    result = asyncio.run(one_turn(server.ws_url, wav=str(question_wav), timeout=180))
    print(f"\ntranscript {result.transcript!r}; reply {result.reply!r}; "
          f"first reply audio {result.first_audio_ms:.0f} ms after the question ended (client clock); "
          f"waterfall {result.waterfall.get('ms')}")
    assert not result.errors, result.errors
    assert "capital" in result.transcript.lower() and "france" in result.transcript.lower()
    assert result.reply.strip()
    pcm = result.pcm()
    assert result.sample_rate == 22050 and np.abs(pcm.astype(np.int32)).max() > 1000
    for mark in ("speech_end", "asr_final", "llm_first_token", "first_audio_out"):
        assert mark in result.waterfall["ms"], result.waterfall


def test_interrupt_mid_answer_stops_audio_within_one_chunk(server):
    with connect(server.ws_url, max_size=None) as ws:
        _start(ws)
        ws.send(json.dumps({"type": "text", "text": "Tell me a long story about a dragon and a knight."}))
        gen = None
        while gen is None:  # the first audio chunk of the answer
            message = ws.recv(timeout=180)
            if isinstance(message, str) and json.loads(message)["type"] == "turn":
                pytest.fail("the answer ended before its first audio chunk")
            if isinstance(message, str) and json.loads(message)["type"] == "audio":
                gen = json.loads(message)["gen"]
                ws.recv(timeout=60)  # its PCM
        ws.send(json.dumps({"type": "interrupt"}))
        late_chunks = 0
        while True:  # until the server confirms the interruption
            message = ws.recv(timeout=60)
            if isinstance(message, bytes):
                continue
            data = json.loads(message)
            if data["type"] == "audio" and data["gen"] == gen:
                late_chunks += 1
            if data["type"] == "interrupted" and data["gen"] > gen:
                break
        # Nothing of the interrupted turn comes after the confirmation, even while a new turn runs.
        ws.send(json.dumps({"type": "text", "text": "Say hi."}))
        after = []
        while True:
            message = ws.recv(timeout=180)
            if isinstance(message, bytes):
                continue
            data = json.loads(message)
            after.append(data)
            if data["type"] == "turn" and data["gen"] > gen:
                break
    print(f"\naudio chunks of the interrupted turn after 'interrupt' was sent: {late_chunks}")
    assert late_chunks <= 1
    assert not [m for m in after if m["type"] in ("audio", "assistant_delta") and m["gen"] <= gen]
    assert any(m["type"] == "audio" for m in after)  # the next turn speaks


def test_two_sessions_at_once_keep_their_histories_apart(server):
    names = {"Alice": None, "Bob": None}
    failures = []

    def talk(name: str) -> None:
        try:
            with connect(server.ws_url, max_size=None) as ws:
                ready = _start(ws)
                for text in (f"My name is {name}.", "What is my name?"):
                    ws.send(json.dumps({"type": "text", "text": text}))
                    while True:
                        message = ws.recv(timeout=240)
                        if isinstance(message, str) and json.loads(message)["type"] == "turn":
                            break
                pipeline = next(p for p in list(server.factory._open) if p.session and p.history
                                and name in p.history[0].user)
                names[name] = (ready["session"], [e.user for e in pipeline.history])
        except Exception as error:  # reported by the main thread
            failures.append(repr(error))

    threads = [threading.Thread(target=talk, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not failures, failures
    (session_a, users_a), (session_b, users_b) = names["Alice"], names["Bob"]
    assert session_a != session_b
    assert users_a == ["My name is Alice.", "What is my name?"]
    assert users_b == ["My name is Bob.", "What is my name?"]


def test_a_client_vanishing_mid_answer_frees_everything(server):
    _wait_idle(server)
    baseline = threading.active_count()
    with connect(server.ws_url, max_size=None) as ws:
        _start(ws)
        assert server.factory.num_open == 1
        ws.send(json.dumps({"type": "text", "text": "Tell me a long story about the sea."}))
        while True:  # mid-answer: the model is writing and the voice is speaking
            message = ws.recv(timeout=180)
            if isinstance(message, str) and json.loads(message)["type"] == "audio":
                break
        ws.socket.shutdown(socket.SHUT_RDWR)  # no close handshake: the client just disappears
    _wait_idle(server, baseline)  # session place, pipeline, its stage threads and the generation: all gone
