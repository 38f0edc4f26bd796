"""The WebSocket protocol with the real pipeline (Whisper, our engine on SmolLM2 int8 — the
production default — and Piper) over a real socket: a spoken turn from a WAV (with partial
transcripts while it is spoken), interrupting mid-answer and the history keeping only what was
heard, two sessions at once, a client that vanishes mid-answer, the OpenAI-compatible /v1 and the
engine's /metrics gauges on the same server, and noise through the real models. One server (and
one set of models) for the whole module. The load test is tests/app/test_load_spoken.py."""
from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import threading
import time

import httpx
import numpy as np
import pytest
from websockets.sync.client import connect

from app.config import AppConfig, PersonasConfig, ServerConfig
from app.openai_api import openai_router
from app.pipeline_sessions import PipelineSessions
from app.server.app import create_app
from app.server.runner import BackgroundServer
from app.ws_client import one_turn
from pipeline.persona.store import SHIPPED_DIR
from pipeline.wavfile import read_wav
from tests.app.socket_checks import num_threads, start, wait_sessions_closed
from tests.setup_needs import need_command

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    personas = tmp_path_factory.mktemp("personas")  # only the shipped personas, whatever this machine's user has
    # ... and "steady": Nova answering greedily, so what a reply says can be checked.
    nova = (SHIPPED_DIR / "nova.toml").read_text()
    (personas / "steady.toml").write_text(re.sub(r"temperature = [0-9.]+", "temperature = 0.0",
                                                 nova.replace('name = "Nova"', 'name = "Steady"')))
    # stall_timeout_s: on 2 shared cores long answers to concurrent sessions are slow, not stalled.
    config = AppConfig(server=ServerConfig(stall_timeout_s=300.0), personas=PersonasConfig(user_dir=personas))
    factory = PipelineSessions(config)  # the configured default backend: our engine
    factory.warm_up()
    app = create_app(config, factory, with_ui=False, routers=(openai_router(factory.llm, config.models.llm),))
    with BackgroundServer(app) as running:
        running.factory, running.registry = factory, app.state.registry
        yield running
    factory.close()


class PromptRecorder:
    """The server's LLM backend, recording every prompt it is asked to answer (and passing it on)."""

    def __init__(self, backend):
        self.backend = backend
        self.prompts: list[list[dict]] = []

    def generate(self, messages, sampling, session=None):
        self.prompts.append([dict(m) for m in messages])
        return self.backend.generate(messages, sampling, session)

    def __getattr__(self, name):
        return getattr(self.backend, name)


@pytest.fixture
def prompts(server):
    """The prompts of the sessions opened during the test (each session takes the factory's LLM
    when it opens)."""
    recorder = PromptRecorder(server.factory.llm)
    server.factory.llm = recorder
    yield recorder.prompts
    server.factory.llm = recorder.backend


def read_until(ws, done, timeout_s: float = 180) -> list[dict]:
    """The JSON messages up to and including the first for which ``done(message)`` is true."""
    seen = []
    while True:
        message = ws.recv(timeout=timeout_s)
        if isinstance(message, str):
            seen.append(json.loads(message))
            if done(seen[-1]):
                return seen


LONG_QUESTION = ("Please tell me, in just a few words, what the capital of France is, and why so many people "
                 "like to visit it in the spring.")


@pytest.fixture(scope="module")
def long_question_wav(tmp_path_factory):
    """About seven seconds of speech (espeak-ng, 22,050 Hz): long enough for several partials."""
    path = tmp_path_factory.mktemp("long") / "long.wav"
    subprocess.run([need_command("espeak-ng"), "-s", "150", "-w", str(path), LONG_QUESTION], check=True)
    return path


def test_a_spoken_turn_from_a_wav_with_partial_transcripts(server, long_question_wav):
    """Streamed in real time: partial transcripts (``final: false``) arrive while the user is still
    speaking, then one final transcript, the answer and its audio."""
    samples, rate, _ = read_wav(long_question_wav)
    result = asyncio.run(one_turn(server.ws_url, wav=str(long_question_wav), timeout=180))
    print(f"\ntranscript {result.transcript!r}; reply {result.reply!r}; "
          f"first reply audio {result.first_audio_ms:.0f} ms after the question ended (client clock); "
          f"waterfall {result.waterfall.get('ms')}")
    assert not result.errors, result.errors
    assert "capital" in result.transcript.lower() and "france" in result.transcript.lower()
    # Every transcript the client saw (a pause mid-sentence resumes the turn under a new gen; a
    # speculative final before it is held back and dropped, partials are shown at once).
    transcripts = [m for m in result.messages if m["type"] == "transcript"]
    partials = [m["text"] for m in transcripts if not m["final"] and m["text"]]
    print(f"{len(partials)} partials over {len(samples) / rate:.1f} s of speech: {partials}")
    assert partials, transcripts
    assert transcripts[-1] == {"type": "transcript", "gen": result.gen, "text": result.transcript, "final": True}
    assert not any(m["final"] for m in transcripts[:-1])  # the partials came first
    assert any(word in partials[0].lower() for word in ("please", "tell", "me")), partials  # the utterance's start
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


STORY = "Tell me a long story about a dragon and a knight."


def test_an_interrupted_reply_is_remembered_only_as_far_as_it_was_heard(server, prompts):
    """The client reports it played exactly the first speakable chunk of the answer, then
    interrupts: the next turn's prompt holds that chunk, marked cut off, and nothing after it."""
    with connect(server.ws_url, max_size=None) as ws:
        start(ws, timeout_s=60, persona="steady")
        ws.send(json.dumps({"type": "text", "text": STORY}))
        chunks: dict[int, dict] = {}  # chunk_index -> its first audio header
        while 1 not in chunks:  # until the second chunk's audio: the first one's is then complete
            data = read_until(ws, lambda m: m["type"] in ("audio", "turn"))[-1]
            if data["type"] == "turn":
                pytest.fail("the answer ended before its second speakable chunk")
            chunks.setdefault(data["chunk_index"], data)
        gen = chunks[0]["gen"]
        # Heard: all of chunk 0 and none of chunk 1, whose audio starts where chunk 0's ends.
        ws.send(json.dumps({"type": "played", "gen": gen, "samples": chunks[1]["start_sample"]}))
        ws.send(json.dumps({"type": "interrupt"}))
        read_until(ws, lambda m: m["type"] == "interrupted" and m["gen"] > gen)
        ws.send(json.dumps({"type": "text", "text": "Say hi."}))
        said = read_until(ws, lambda m: m["type"] == "transcript" and m["final"] and m["text"] == "Say hi.")[-1]
        read_until(ws, lambda m: m["type"] == "turn" and m["gen"] == said["gen"])
    prompt = next(p for p in prompts if p[-1]["content"] == "Say hi.")
    heard = " ".join(chunks[0]["text"].split())
    print(f"\nheard {heard!r}; not heard: {chunks[1]['text']!r}...\nnext prompt: {prompt[1:]}")
    assert prompt[1:] == [{"role": "user", "content": STORY}, {"role": "assistant", "content": heard + "..."},
                          {"role": "user", "content": "Say hi."}]
    wait_sessions_closed(server)


def test_two_sessions_at_once_keep_their_histories_apart(server, prompts):
    """Alice and Bob talk at the same time: each server session holds exactly the exchanges its own
    client had, and each second answer is generated from its own session's exchanges (its prompt
    holds its own name and the first reply its client got, nothing of the other's). SmolLM2-135M
    does not reliably say the name back (measured: "My name is Emily" to Alice), so the answer's
    words are only checked for the other's name."""
    names = {"Alice": None, "Bob": None}
    failures = []

    def talk(name: str) -> None:
        try:
            with connect(server.ws_url, max_size=None) as ws:
                ready = start(ws, timeout_s=60, persona="steady")
                exchanges = []
                for text in (f"My name is {name}.", "What is my name?"):
                    ws.send(json.dumps({"type": "text", "text": text}))
                    seen = read_until(ws, lambda m: m["type"] == "assistant_done", timeout_s=240)
                    exchanges.append((text, seen[-1]["text"]))
                    gen = seen[-1]["gen"]
                    seen += read_until(ws, lambda m: m["type"] == "turn" and m["gen"] == gen, timeout_s=240)
                    # Heard to the end, as a client that plays the audio reports it (without the report
                    # the server estimates real-time playback, and the next text would cut the reply).
                    audio = [m for m in seen if m["type"] == "audio" and m["gen"] == gen]
                    assert audio, "the answer was not spoken"
                    played = max(m["start_sample"] + m["samples"] for m in audio)
                    ws.send(json.dumps({"type": "played", "gen": gen, "samples": played}))
                pipeline = next(p for p in list(server.factory._open) if p.session and p.history
                                and name in p.history[0].user)
                names[name] = (ready["session"], exchanges, [(e.user, e.assistant) for e in pipeline.history])
        except Exception as error:  # reported by the main thread
            failures.append(repr(error))

    threads = [threading.Thread(target=talk, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not failures, failures
    (session_a, client_a, server_a), (session_b, client_b, server_b) = names["Alice"], names["Bob"]
    print(f"\nAlice: {client_a}\nBob: {client_b}")
    assert session_a != session_b
    assert [user for user, _ in server_a] == ["My name is Alice.", "What is my name?"]
    assert [user for user, _ in server_b] == ["My name is Bob.", "What is my name?"]
    assert server_a == client_a and server_b == client_b  # each session's history is what its client was told
    for (name, other), exchanges in (("Alice", "Bob"), client_a), (("Bob", "Alice"), client_b):
        prompt = next(p for p in prompts if p[-1]["content"] == "What is my name?" and name in p[1]["content"])
        assert prompt[1:] == [{"role": "user", "content": f"My name is {name}."},
                              {"role": "assistant", "content": exchanges[0][1]},
                              {"role": "user", "content": "What is my name?"}]
        assert other not in exchanges[1][1]


def test_a_client_vanishing_mid_answer_frees_everything(server):
    wait_sessions_closed(server)
    baseline = num_threads()
    engine = server.factory.llm
    idle = engine.stats()
    with connect(server.ws_url, max_size=None) as ws:
        start(ws, timeout_s=60)
        assert server.factory.num_open == 1
        ws.send(json.dumps({"type": "text", "text": "Tell me a long story about the sea."}))
        while True:  # mid-answer: the model is writing and the voice is speaking
            message = ws.recv(timeout=180)
            if isinstance(message, str) and json.loads(message)["type"] == "audio":
                break
        assert engine.stats().slots_busy > idle.slots_busy and engine.stats().slots_held > idle.slots_held
        ws.socket.shutdown(socket.SHUT_RDWR)  # no close handshake: the client just disappears
    wait_sessions_closed(server, baseline)  # session place, pipeline, its stage threads and the generation: all gone
    # ... and its engine slot: the generation was cancelled (its slot freed within a step or two,
    # not after the answer ran to its end) and the conversation's held slot given back.
    closed = engine.stats()
    deadline = time.monotonic() + 30
    while (engine.stats().slots_busy, engine.stats().slots_held) != (idle.slots_busy, idle.slots_held) \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    after = engine.stats()
    print(f"\nslots busy {idle.slots_busy} -> {after.slots_busy}, held {idle.slots_held} -> {after.slots_held}; "
          f"{after.steps - closed.steps} engine steps after the session closed")
    assert (after.slots_busy, after.slots_held) == (idle.slots_busy, idle.slots_held)
    assert after.steps - closed.steps <= 3


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
    assert httpx.post(server.url + "/v1/chat/completions", json={"messages": []}, timeout=30).status_code == 400
    stats = server.factory.llm.stats()
    assert stats.slots_busy == 0  # requests without a session give their slot back


def engine_gauges(server) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    body = httpx.get(server.url + "/metrics", timeout=30).text
    return {s.name: s.value for family in text_string_to_metric_families(body) for s in family.samples
            if s.name.startswith("voxlane_engine_")}


def test_metrics_show_the_real_engines_slots_and_throughput(server):
    """/metrics reads the engine itself: its slot count, a slot running a generation and the
    decode rate while it runs, and the slot given back after."""
    wait_sessions_closed(server)
    num_slots = server.factory.llm.stats().num_slots
    idle = engine_gauges(server)
    assert idle["voxlane_engine_kv_slots"] == num_slots > 0 and idle["voxlane_engine_kv_slots_in_use"] == 0
    body = {"messages": [{"role": "user", "content": "Tell me a long story about the sea."}], "stream": True,
            "temperature": 0, "max_tokens": 40}
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=120, json=body) as response:
        lines = response.iter_lines()
        for _ in range(12):  # a dozen lines (six tokens) in: the generation is running
            next(lines)
        running = engine_gauges(server)
        for _ in lines:  # the rest of the answer
            pass
    print(f"\nidle {idle}\nwhile generating {running}")
    assert running["voxlane_engine_kv_slots_in_use"] >= 1 and running["voxlane_engine_tokens_per_second"] > 0
    assert engine_gauges(server)["voxlane_engine_kv_slots_in_use"] == 0


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
