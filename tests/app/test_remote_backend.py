"""The remote (OpenAI-compatible) LLM backend: against Voxlane's own /v1 in another process, and
against a small scripted server for the faults (refusals, 503s, stalls, a drop mid-stream)."""
from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from app.server.runner import bind_socket
from engine.backends.remote import RemoteBackend, RemoteError, RemoteSettings
from engine.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parents[2]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
QUESTION = [{"role": "system", "content": "You are concise."},
            {"role": "user", "content": "What is the capital of France?"}]


def wait_for(url: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)
    raise TimeoutError(url)


@pytest.fixture(scope="module")
def voxlane_v1():
    """Voxlane's own OpenAI-compatible API, in another process, on our engine and the packaged SmolLM2."""
    process = subprocess.Popen([sys.executable, "-m", "tests.app.openai_server", "0", "engine"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        port = int(process.stdout.readline())  # bound before the model loads: the port is known at once
        wait_for(f"http://127.0.0.1:{port}/v1/models")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_streams_a_real_answer_from_voxlanes_own_api(voxlane_v1):
    backend = RemoteBackend(RemoteSettings(voxlane_v1, "smollm2-135m-instruct"))
    deltas = list(backend.generate(QUESTION, GREEDY))
    assert len(deltas) > 1  # streamed, not one blob
    assert "Paris" in "".join(deltas)
    backend.close()


def test_dry_settings_reach_the_server(voxlane_v1):
    """DRY goes out under llama.cpp's server's names, and Voxlane's own /v1 takes them."""
    dry = SamplingParams(temperature=0.0, max_tokens=24, dry_multiplier=0.8, dry_base=2.0, dry_allowed_length=3)
    backend = RemoteBackend(RemoteSettings(voxlane_v1, "smollm2-135m-instruct"))
    body = backend.request_body(QUESTION, dry)
    assert (body["dry_multiplier"], body["dry_base"], body["dry_allowed_length"]) == (0.8, 2.0, 3)
    assert "dry_multiplier" not in backend.request_body(QUESTION, GREEDY)  # off: nothing a server may refuse
    assert "Paris" in "".join(backend.generate(QUESTION, dry))
    backend.close()


def test_non_streaming_and_models_endpoints(voxlane_v1):
    models = httpx.get(f"{voxlane_v1}/models").json()
    assert models["data"][0]["id"] == "smollm2-135m-instruct"
    reply = httpx.post(f"{voxlane_v1}/chat/completions", timeout=60, json={
        "messages": QUESTION, "temperature": 0, "max_tokens": 24}).json()
    assert "Paris" in reply["choices"][0]["message"]["content"]
    assert reply["usage"]["prompt_tokens"] > 10 and reply["usage"]["completion_tokens"] > 0


def test_bad_requests_get_400s_not_crashes(voxlane_v1):
    for body in ({"messages": []}, {"messages": [{"role": "wizard", "content": "x"}]},
                 {"messages": QUESTION, "temperature": 7}, {"messages": QUESTION, "stop": ["a"] * 5}, {}):
        assert httpx.post(f"{voxlane_v1}/chat/completions", json=body).status_code == 400, body  # OpenAI's status
    assert httpx.post(f"{voxlane_v1}/chat/completions", content=b"{not json",
                      headers={"content-type": "application/json"}).status_code == 400
    # and it still answers afterwards
    assert "Paris" in "".join(RemoteBackend(RemoteSettings(voxlane_v1)).generate(QUESTION, GREEDY))


def test_stop_strings_cut_the_stream(voxlane_v1):
    text = "".join(RemoteBackend(RemoteSettings(voxlane_v1)).generate(QUESTION, SamplingParams(
        temperature=0.0, max_tokens=24, stop=("Paris",))))
    assert "Paris" not in text and text.strip()


class ScriptedServer:
    """A tiny OpenAI-style SSE server whose answers follow a script, one entry per request:
    an HTTP status to fail with, "stall" to hang, "drop" to break mid-stream, or "ok"."""

    def __init__(self, script: list, sock: socket.socket | None = None):
        self.script = list(script)
        self.requests = 0
        self.closed_early = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests += 1
                step = outer.script.pop(0) if outer.script else "ok"
                if isinstance(step, int):
                    self.send_response(step)
                    self.send_header("Retry-After", "0")
                    self.end_headers()
                    return
                if step == "stall":
                    time.sleep(5)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                words = ["Hello", " there", ",", " friend", "."] * (40 if step == "long" else 1)
                try:
                    for i, word in enumerate(words):
                        if step == "drop" and i == 2:
                            self.connection.shutdown(socket.SHUT_RDWR)
                            return
                        chunk = {"choices": [{"index": 0, "delta": {"content": word}}]}
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                        self.wfile.flush()
                        time.sleep(0.05 if step == "long" else 0)
                    self.wfile.write(b"data: [DONE]\n\n")
                except (BrokenPipeError, ConnectionResetError):
                    outer.closed_early.set()

        if sock is None:
            self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        else:  # listen on a socket reserved (bound, refusing connections) earlier
            self.server = ThreadingHTTPServer(sock.getsockname(), Handler, bind_and_activate=False)
            self.server.socket.close()
            self.server.socket = sock
            self.server.server_activate()
        self.server.block_on_close = False  # a stalled handler must not hold up the test's teardown
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def settings(url: str, **kw) -> RemoteSettings:
    return RemoteSettings(url, backoff_s=0.01, **kw)


def test_retries_5xx_and_429_before_the_first_token():
    server = ScriptedServer([503, 429, 502, "ok"])
    assert "".join(RemoteBackend(settings(server.url)).generate(QUESTION, GREEDY)) == "Hello there, friend."
    assert server.requests == 4
    server.close()


def test_gives_up_after_max_retries_with_a_clear_error():
    server = ScriptedServer([503] * 10)
    with pytest.raises(RemoteError, match="HTTP 503"):
        list(RemoteBackend(settings(server.url, max_retries=2)).generate(QUESTION, GREEDY))
    assert server.requests == 3
    server.close()


class RetryWatch(logging.Handler):
    """Sets ``retried`` when the remote backend logs that it will retry (its first refusal)."""

    def __init__(self):
        super().__init__()
        self.retried = threading.Event()

    def emit(self, record):
        if "retry" in record.getMessage():
            self.retried.set()


def test_refused_connections_then_recovery():
    reserved = bind_socket()  # bound, not listening: connections are refused until the server listens on it
    port = reserved.getsockname()[1]
    backend = RemoteBackend(RemoteSettings(f"http://127.0.0.1:{port}/v1", backoff_s=0.2, max_retries=6))
    watch = RetryWatch()
    logging.getLogger("engine.backends.remote").addHandler(watch)
    result = {}
    worker = threading.Thread(target=lambda: result.update(text="".join(backend.generate(QUESTION, GREEDY))))
    try:
        worker.start()
        assert watch.retried.wait(30), "the backend never retried"  # it was refused at least once
        server = ScriptedServer([], sock=reserved)
        worker.join(timeout=60)
    finally:
        logging.getLogger("engine.backends.remote").removeHandler(watch)
    assert result.get("text") == "Hello there, friend."
    server.close()


def test_a_drop_after_tokens_is_not_retried():
    server = ScriptedServer(["drop", "ok"])
    seen = []
    with pytest.raises(RemoteError):
        for delta in RemoteBackend(settings(server.url)).generate(QUESTION, GREEDY):
            seen.append(delta)
    assert seen == ["Hello", " there"] and server.requests == 1  # never repeats spoken text
    server.close()


def test_a_stalled_server_times_out():
    server = ScriptedServer(["stall"] * 5)
    with pytest.raises(RemoteError):
        list(RemoteBackend(settings(server.url, timeout_s=0.5, max_retries=1)).generate(QUESTION, GREEDY))
    assert server.requests == 2
    server.close()


def test_cancel_closes_the_stream():
    server = ScriptedServer(["long"])
    completion = RemoteBackend(settings(server.url)).generate(QUESTION, GREEDY)
    received = []
    for delta in completion:
        received.append(delta)
        if len(received) == 3:
            completion.cancel()
    assert len(received) == 3
    assert server.closed_early.wait(5)  # the server saw the connection go away and stopped writing
    server.close()
