"""The WebSocket protocol with the real pipeline (Whisper, our engine on SmolLM2 int8 — the
production default — and Piper) over a real socket: a spoken turn from a WAV, interrupting
mid-answer, two sessions at once, a client that vanishes mid-answer, the OpenAI-compatible /v1 on
the same server, and noise through the real models. One server (and one set of models) for the
whole module. The load test is tests/app/test_load_spoken.py."""
from __future__ import annotations

import asyncio
import json
import os
import socket
import threading

import httpx
import numpy as np
import pytest
from websockets.sync.client import connect

from app.client import one_turn
from app.config import AppConfig, PersonasConfig, ServerConfig
from app.openai_api import openai_router
from app.server.app import create_app
from app.server.pipeline_conversations import PipelineConversations
from app.server.runner import BackgroundServer
from tests.app.socket_checks import num_threads, start, wait_sessions_closed

pytestmark = pytest.mark.slow
BACKEND = os.environ.get("VOXLANE_TEST_BACKEND", "engine")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    personas = tmp_path_factory.mktemp("personas")  # only the shipped personas, whatever this machine's user has
    # stall_timeout_s: on 2 shared cores long answers to concurrent sessions are slow, not stalled.
    config = AppConfig(server=ServerConfig(stall_timeout_s=300.0), personas=PersonasConfig(user_dir=personas))
    factory = PipelineConversations(config, BACKEND)
    factory.warm_up()
    app = create_app(config, factory, with_ui=False, routers=(openai_router(factory.llm, config.models.llm),))
    with BackgroundServer(app) as running:
        running.factory, running.registry = factory, app.state.registry
        yield running
    factory.close()


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
        start(ws, timeout_s=60)
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
                ready = start(ws, timeout_s=60)
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
    wait_sessions_closed(server)
    baseline = num_threads()
    with connect(server.ws_url, max_size=None) as ws:
        start(ws, timeout_s=60)
        assert server.factory.num_open == 1
        ws.send(json.dumps({"type": "text", "text": "Tell me a long story about the sea."}))
        while True:  # mid-answer: the model is writing and the voice is speaking
            message = ws.recv(timeout=180)
            if isinstance(message, str) and json.loads(message)["type"] == "audio":
                break
        ws.socket.shutdown(socket.SHUT_RDWR)  # no close handshake: the client just disappears
    wait_sessions_closed(server, baseline)  # session place, pipeline, its stage threads and the generation: all gone


def test_openai_api_streams_from_the_engine_on_the_same_server(server):
    models = httpx.get(server.url + "/v1/models", timeout=30).json()
    assert models["data"][0]["id"] == "smollm2-135m-instruct"
    question = [{"role": "user", "content": "What is the capital of France?"}]
    chunks = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=120,
                      json={"messages": question, "stream": True, "temperature": 0, "max_tokens": 24}) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                chunks.append(line[6:])
    assert chunks[-1] == "[DONE]"
    events = [json.loads(c) for c in chunks[:-1]]
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    assert len(events) > 2 and "Paris" in text, text  # streamed token by token, not one blob
    assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    reply = httpx.post(server.url + "/v1/chat/completions", timeout=120,
                       json={"messages": question, "temperature": 0, "max_tokens": 24}).json()
    assert reply["choices"][0]["message"]["content"] == text  # greedy: the same answer without streaming
    assert httpx.post(server.url + "/v1/chat/completions", json={"messages": []}, timeout=30).status_code == 422
    stats = server.factory.llm.stats()
    assert stats.slots_busy == 0  # requests without a session give their slot back


def test_clipped_noise_through_the_real_models_then_a_normal_turn(server):
    """Full-scale noise and clipping go through the real VAD and Whisper without an error (whatever
    they make of it), and a typed turn right after is answered."""
    noise = np.random.default_rng(1).integers(-32768, 32768, 32000).astype("<i2")
    square = np.where(np.arange(32000) % 40 < 20, 32767, -32768).astype("<i2")
    with connect(server.ws_url, max_size=None) as ws:
        start(ws, timeout_s=60)
        audio = np.concatenate([noise, square, np.zeros(24000, "<i2")]).tobytes()
        for i in range(0, len(audio), 640):
            ws.send(audio[i:i + 640])
        ws.send(json.dumps({"type": "text", "text": "Say hi."}))
        seen, gen = [], None
        while True:
            message = ws.recv(timeout=180)
            if isinstance(message, bytes):
                continue
            seen.append(json.loads(message))
            if seen[-1]["type"] == "transcript" and seen[-1]["text"] == "Say hi.":
                gen = seen[-1]["gen"]
            if seen[-1]["type"] == "turn" and seen[-1]["gen"] == gen:
                break
    assert not [m for m in seen if m["type"] == "error"], seen
    assert any(m["type"] == "audio" and m["gen"] == gen for m in seen)
    wait_sessions_closed(server)
