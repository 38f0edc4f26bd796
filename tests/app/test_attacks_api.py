"""Attacks on ``/v1`` and on the pipeline's edges of a live server (issue 11), over real sockets,
with scripted models (fast; the real engine's share is tests/app/test_attacks_engine.py):
admission control, cancel on disconnect, what the API refuses, the watchdog of a turn whose LLM
never starts, and audio that a stuck pipeline cannot take."""
from __future__ import annotations

import concurrent.futures
import json
import socket
import threading
import time

import httpx
import numpy as np
import pytest
from websockets.sync.client import connect

from tests.app.scripted_models import make_server
from tests.app.socket_checks import assert_normal_turn, next_error, start, wait_idle

USER = [{"role": "user", "content": "hello"}]


def wait_for(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture(scope="module")
def api(silero_vad_path):
    with make_server(silero_vad_path, with_api=True, max_api_requests=4, max_sessions=4) as running:
        yield running
        running.factory.close()


# --- finding 5: admission control, the shared thread pool, cancel on disconnect -------------------

def test_v1_requests_beyond_the_cap_get_429_and_voice_sessions_still_open(api):
    """16 streams that never end (the scripted LLM stalls until cancelled) held every thread of the
    event loop's default pool: a new /ws session waited for "ready". Now 4 are admitted, 12 get 429
    with Retry-After, and a session opens and answers while the 4 still stream."""
    clients = [httpx.Client(base_url=api.url, timeout=60) for _ in range(16)]
    streams, statuses = [], []
    try:
        for client in clients:
            request = client.build_request("POST", "/v1/chat/completions",
                                           json={"messages": [{"role": "user", "content": "STALL"}], "stream": True})
            response = client.send(request, stream=True)
            statuses.append(response.status_code)
            if response.status_code == 429:
                assert int(response.headers["retry-after"]) >= 1
                assert response.read() and response.json()["error"]["code"] == "rate_limited"
            streams.append(response)
        assert statuses.count(200) == 4 and statuses.count(429) == 12, statuses
        assert wait_for(lambda: api.factory.llm.active == 4)
        with connect(api.ws_url, open_timeout=60) as ws:
            start(ws, timeout_s=60)
            assert_normal_turn(ws)
    finally:
        for response in streams:
            response.close()
        for client in clients:
            client.close()
    assert wait_for(lambda: api.factory.llm.active == 0), "the streams' generations were not cancelled"
    # the places are free again
    assert httpx.post(api.url + "/v1/chat/completions", json={"messages": USER}, timeout=60).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_cancels_its_generation(api, stream):
    """A non-streaming request kept generating after its client left."""
    body = json.dumps({"messages": [{"role": "user", "content": "STALL"}], "stream": stream}).encode()
    with socket.create_connection((api.host, api.port), timeout=60) as sock:
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert wait_for(lambda: api.factory.llm.active == 1)  # generating
    assert wait_for(lambda: api.factory.llm.active == 0), "the generation went on after its client left"


# --- finding 13 (and 1's edge): what the API refuses, by name --------------------------------------

@pytest.mark.parametrize("extra, param", [
    ({"seed": 2**64}, "seed"),
    ({"seed": -1}, "seed"),
    ({"temperature": 9}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"repetition_penalty": 5}, "repetition_penalty"),
    ({"top_k": -1}, "top_k"),
    ({"dry_multiplier": 9}, "dry_multiplier"),
    ({"dry_allowed_length": 0}, "dry_allowed_length"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": "x" * 65}, "stop"),
    ({"n": 2}, "n"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"logprobs": True}, "logprobs"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"functions": []}, "functions"),
])
def test_bad_or_unsupported_fields_get_400_naming_them(api, extra, param):
    response = httpx.post(api.url + "/v1/chat/completions", json={"messages": USER, **extra}, timeout=60)
    assert response.status_code == 400, (extra, response.status_code, response.text)
    error = response.json()["error"]
    assert error["param"] == param and param in error["message"], error


def test_neutral_values_of_unsupported_fields_are_fine(api):
    body = {"messages": USER, "n": 1, "presence_penalty": 0, "frequency_penalty": 0, "logprobs": False,
            "response_format": {"type": "text"}, "user": "u-1", "stop": ["\n\n"], "seed": 2**63 - 1}
    response = httpx.post(api.url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "You said: hello."


def test_bodies_the_parser_refuses_are_400_and_text_plain_is_refused(api):
    huge_int = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": ' + "7" * 4301 + "}"
    for content, headers, status in (
            (huge_int, {"content-type": "application/json"}, 400),
            ("[" * 50_000, {"content-type": "application/json"}, 400),
            ("{not json", {"content-type": "application/json"}, 400),
            (json.dumps({"messages": USER}), {"content-type": "text/plain"}, 415),  # a "simple" CORS request
            (json.dumps({"messages": USER}), {}, 415)):
        response = httpx.post(api.url + "/v1/chat/completions", content=content, headers=headers, timeout=60)
        assert response.status_code == status and "error" in response.json(), (content[:40], response.text[:200])


# --- finding 5: the watchdog is armed from the moment a typed turn starts -------------------------

class StuckPrewarm:
    """Wraps the scripted LLM: a session's prewarm (its first, 1-token generation) never returns
    and ignores cancel, like a backend that hangs; later generations are the scripted ones."""

    def __init__(self, llm):
        self.llm, self.release = llm, threading.Event()

    def __getattr__(self, name):
        return getattr(self.llm, name)

    def generate(self, messages, sampling, session=None):
        if sampling.max_tokens == 1:
            release = self.release

            class Hang:
                def __iter__(self):
                    release.wait(120)
                    return iter(())

                def cancel(self):
                    pass

            return Hang()
        return self.llm.generate(messages, sampling, session)


def test_a_typed_turn_whose_llm_never_starts_gets_the_apology(silero_vad_path):
    """The watchdog started only at the final transcript, which the LLM stage writes: a stage that
    never got to the turn left the client with nothing at all (44 s in the issue)."""
    with make_server(silero_vad_path, stall_timeout_s=2.0) as running:
        stuck = StuckPrewarm(running.factory.llm)
        running.factory.llm = stuck
        try:
            with connect(running.ws_url) as ws:
                start(ws)
                ws.send(json.dumps({"type": "text", "text": "hello"}))
                error = next_error(ws, timeout_s=60)
                assert error["code"] == "timeout" and error["stage"] == "llm" and not error["fatal"], error
        finally:
            stuck.release.set()
        running.factory.llm = stuck.llm
        wait_idle(running)
        running.factory.close()


# --- finding 13: push_audio never blocks the event loop ------------------------------------------

def test_audio_a_stuck_pipeline_cannot_take_is_dropped_not_waited_for(silero_vad_path):
    """The VAD's queue (2,000 frames) full behind a stuck VAD: the next frame's Queue.put blocked
    the event loop, and with it every session and /healthz."""
    with make_server(silero_vad_path) as running:
        model = running.factory.vad_model
        session, release = model.session, threading.Event()

        class StuckSession:
            def run(self, *args, **kwargs):
                release.wait(120)
                return session.run(*args, **kwargs)

        model.session = StuckSession()
        try:
            with connect(running.ws_url) as ws:
                start(ws)
                frame = np.zeros(160, "<i2").tobytes()  # 10 ms
                for _ in range(2100):
                    ws.send(frame)
                with concurrent.futures.ThreadPoolExecutor(1) as pool:  # the loop still answers
                    health = pool.submit(httpx.get, running.url + "/healthz", timeout=60).result(timeout=90)
                assert health.status_code == 200
                assert wait_for(lambda: running.metrics.audio_dropped._value.get() >= 1)
        finally:
            release.set()
            model.session = session
        wait_idle(running)
        running.factory.close()
