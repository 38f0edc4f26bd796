"""Bad input over a real socket, against the real pipeline (Silero VAD, turn logic, chunker, stages,
session pump) with scripted models: each bad input gets its error code, the server then serves a
normal turn, and every pipeline, thread and LLM slot comes back to its baseline."""
from __future__ import annotations

import json
import socket
import time

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.app.scripted_models import LIMIT, make_server
from tests.app.socket_checks import assert_normal_turn, closed_with, next_error, num_threads, start, turn, wait_idle


@pytest.fixture(scope="module")
def server(silero_vad_path):
    with make_server(silero_vad_path) as running:
        yield running
        running.factory.close()


@pytest.fixture
def baseline(server):
    wait_idle(server)
    return num_threads()


def pcm(samples) -> bytes:
    return np.asarray(samples, dtype="<i2").tobytes()


SQUARE = pcm(np.where(np.arange(32000) % 40 < 20, 32767, -32768))  # 2 s of full-scale clipping
NOISE = pcm(np.random.default_rng(0).integers(-32768, 32768, 32000))

# After "start": bad input -> a non-fatal error with this code; the same session then answers normally.
AFTER_START = [
    ("not json", "bad_json"),
    ("[1, 2]", "bad_json"),
    ('"just a string"', "bad_json"),
    ("null", "bad_json"),
    ("", "bad_json"),
    ("{", "bad_json"),
    ("[" * 60_000, "bad_json"),  # deeper than the parser's stack (and within the 64 KiB text-frame cap)
    (json.dumps({"type": "dance"}), "bad_message"),
    (json.dumps({}), "bad_message"),
    (json.dumps({"type": 5}), "bad_message"),
    (json.dumps({"type": "text"}), "bad_message"),
    (json.dumps({"type": "text", "text": 5}), "bad_message"),
    (json.dumps({"type": "text", "text": "   "}), "bad_message"),
    (json.dumps({"type": "text", "text": "x" * 5_000}), "bad_message"),  # above 4,000 characters
    ('{"type": "text", "text": "\\ud800"}', "bad_message"),  # a lone surrogate no UTF-8 answer can carry
    (json.dumps({"type": "played", "gen": -1, "samples": 3}), "bad_message"),
    (json.dumps({"type": "played", "gen": 1, "samples": "3"}), "bad_message"),
    (json.dumps({"type": "played", "gen": True, "samples": 3}), "bad_message"),
    ('{"type": "played", "gen": NaN, "samples": 1}', "bad_message"),
    ('{"type": "played", "gen": 1, "samples": Infinity}', "bad_message"),
    (json.dumps({"type": "persona", "persona": "nobody"}), "unknown_persona"),
    (json.dumps({"type": "persona", "persona": "n" * 10_000}), "unknown_persona"),
    (json.dumps({"type": "persona", "persona": None}), "bad_message"),
    (json.dumps({"type": "persona", "persona": "../../etc/passwd"}), "unknown_persona"),
    (json.dumps({"type": "start", "sample_rate": 16000}), "already_started"),
    (b"\x01\x02\x03", "bad_audio"),
    (b"\x01", "bad_audio"),
]


@pytest.mark.parametrize("message, code", AFTER_START, ids=[f"{i}-{c}" for i, (_, c) in enumerate(AFTER_START)])
def test_bad_message_after_start(server, baseline, message, code):
    with connect(server.ws_url) as ws:
        start(ws)
        ws.send(message)
        error = next_error(ws)
        assert error["code"] == code and error["fatal"] is False and error["message"], error
        assert_normal_turn(ws)
    wait_idle(server, baseline)


# Before "start": refused with a code; a valid "start" on the same socket still works.
BEFORE_START = [
    (json.dumps({"type": "text", "text": "hello"}), "not_started"),
    (b"\x00\x00", "not_started"),
    (json.dumps({"type": "start", "sample_rate": 100}), "bad_message"),
    (json.dumps({"type": "start", "sample_rate": 10 ** 9}), "bad_message"),
    (json.dumps({"type": "start", "sample_rate": "16000"}), "bad_message"),
    ('{"type": "start", "sample_rate": Infinity}', "bad_message"),
    (json.dumps({"type": "start"}), "bad_message"),
    (json.dumps({"type": "start", "sample_rate": 16000, "format": "mp3"}), "bad_message"),
    (json.dumps({"type": "start", "sample_rate": 16000, "version": "1"}), "bad_message"),
    (json.dumps({"type": "start", "sample_rate": 16000, "persona": "nobody"}), "unknown_persona"),
    (json.dumps({"type": "start", "sample_rate": 16000, "persona": 7}), "bad_message"),
]


@pytest.mark.parametrize("message, code", BEFORE_START, ids=[f"{i}-{c}" for i, (_, c) in enumerate(BEFORE_START)])
def test_bad_message_before_start(server, baseline, message, code):
    with connect(server.ws_url) as ws:
        ws.send(message)
        error = next_error(ws)
        assert error["code"] == code and error["fatal"] is False, error
        start(ws)
        assert_normal_turn(ws)
    wait_idle(server, baseline)


@pytest.mark.parametrize("name, audio, rate", [
    ("full-scale clipping", SQUARE, 16000),
    ("white noise at the int16 extremes", NOISE, 16000),
    ("8 kHz, the lowest rate", NOISE[:16000], 8000),
    ("192 kHz, the highest rate", NOISE, 192000),
    ("one-sample frames", pcm([32767]) * 400, 16000),
])
def test_odd_but_valid_audio_is_taken_without_errors(server, baseline, name, audio, rate):
    with connect(server.ws_url) as ws:
        start(ws, sample_rate=rate)
        step = 4000 if len(audio) > 800 else 2
        for i in range(0, len(audio), step):
            ws.send(audio[i:i + step])
        for _ in range(10):  # a second of silence ends whatever the VAD heard
            ws.send(pcm(np.zeros(rate // 10)))
        seen = turn(ws, "ping")
        assert not [m for m in seen if m["type"] == "error"], seen
        assert "".join(m["text"] for m in seen if m["type"] == "assistant_delta") == "You said: ping."
    wait_idle(server, baseline)


def test_message_flood_is_rate_limited_and_the_session_goes_on(server, baseline):
    with connect(server.ws_url) as ws:
        start(ws)
        for _ in range(400):
            ws.send(json.dumps({"type": "played", "gen": 0, "samples": 0}))
        error = next_error(ws)
        assert error["code"] == "rate_limited" and not error["fatal"]
        time.sleep(1.5)  # the bucket refills
        assert_normal_turn(ws)
    wait_idle(server, baseline)


def test_audio_faster_than_the_limit_is_rate_limited(server, baseline):
    with connect(server.ws_url) as ws:
        start(ws, sample_rate=8000)
        for _ in range(40):  # 80 s of audio at once; the limit allows a 60 s burst
            ws.send(pcm(np.zeros(16000)))
        error = next_error(ws)
        assert error["code"] == "rate_limited" and "max_audio_speed" in error["message"]
        assert_normal_turn(ws)
    wait_idle(server, baseline)


@pytest.mark.parametrize("size, code", [(LIMIT + 2, "message_too_large"), (5 * LIMIT, None)])
def test_oversized_frames_close_the_session(server, baseline, size, code):
    with connect(server.ws_url, max_size=None) as ws:
        start(ws)
        if code:  # within 4x the limit: a JSON error, then close 1009
            ws.send(b"\x00" * size)
            error = next_error(ws)
            assert error["code"] == code and error["fatal"] is True
            assert closed_with(ws) == 1009
        else:  # beyond 4x: the transport refuses it before buffering, and closes with 1009
            try:
                ws.send(b"\x00" * size)
                close_code = closed_with(ws)
            except ConnectionClosed:  # the server closed while the client was still writing (broken pipe)
                close_code = None
            # None: the server's close frame was lost with the connection, which the server closed
            # with part of the frame unread (the kernel resets it); it closed all the same.
            assert close_code in (1009, None)
    with connect(server.ws_url) as ws:
        start(ws)
        assert_normal_turn(ws)
    wait_idle(server, baseline)


def test_an_unsupported_version_is_fatal(server, baseline):
    with connect(server.ws_url) as ws:
        ws.send(json.dumps({"type": "start", "version": 99, "sample_rate": 16000}))
        error = next_error(ws)
        assert error["code"] == "unsupported_version" and error["message"]
        assert closed_with(ws) == 4000
    with connect(server.ws_url) as ws:
        start(ws)
        assert_normal_turn(ws)
    wait_idle(server, baseline)


def test_no_start_within_the_start_timeout_is_fatal(silero_vad_path):
    with make_server(silero_vad_path, start_timeout_s=1.0) as running:
        with connect(running.ws_url) as ws:  # nothing at all within start_timeout_s
            error = next_error(ws)
            assert error["code"] == "not_started" and error["message"]
            assert closed_with(ws) == 1008
        with connect(running.ws_url) as ws:
            start(ws)
            assert_normal_turn(ws)
        wait_idle(running)


def test_foreign_origin_is_refused(server, baseline):
    with connect(server.ws_url, origin="http://evil.example") as ws:
        assert next_error(ws)["code"] == "forbidden_origin"
        assert closed_with(ws) == 4003
    wait_idle(server, baseline)


def test_allowed_origins_admit_a_listed_page_and_only_it(silero_vad_path):
    """``server.allowed_origins``: a page served elsewhere (say a dev server) may use the API when
    listed; other pages still may not; the server's own origin always may."""
    with make_server(silero_vad_path, allowed_origins=("http://localhost:5173",)) as running:
        for origin in ("http://localhost:5173", f"http://127.0.0.1:{running.port}"):
            with connect(running.ws_url, origin=origin) as ws:
                start(ws)
                assert_normal_turn(ws)
        for origin in ("http://localhost:5174", "https://localhost:5173", "http://evil.example"):
            with connect(running.ws_url, origin=origin) as ws:
                assert next_error(ws)["code"] == "forbidden_origin"
                assert closed_with(ws) == 4003
        wait_idle(running)


def test_a_client_vanishing_mid_turn_frees_everything(server, baseline):
    with connect(server.ws_url, max_size=None) as ws:
        start(ws)
        ws.send(json.dumps({"type": "text", "text": "FLOOD"}))
        while not (isinstance(m := ws.recv(timeout=30), str) and json.loads(m)["type"] == "audio"):
            pass
        ws.socket.shutdown(socket.SHUT_RDWR)  # no close handshake
    wait_idle(server, baseline)
    with connect(server.ws_url) as ws:
        start(ws)
        assert_normal_turn(ws)


def test_a_client_that_never_reads_is_dropped(silero_vad_path):
    """Backpressure: queues are bounded, and a client that reads nothing for send_timeout_s (1 s
    here) loses its session instead of the server buffering its answers forever."""
    with make_server(silero_vad_path, send_timeout_s=1.0) as server:
        with connect(server.ws_url, max_size=None) as ws:
            start(ws)
            ws.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            for _ in range(4):
                ws.send(json.dumps({"type": "text", "text": "FLOOD please"}))
            deadline = time.monotonic() + 60
            while server.registry.num_open and time.monotonic() < deadline:  # without reading a byte
                time.sleep(0.1)
            assert server.registry.num_open == 0, "the slow client still holds its session"
            assert server.metrics.errors.labels(code="slow_client")._value.get() >= 1
            ws.socket.shutdown(socket.SHUT_RDWR)
        wait_idle(server)
        with connect(server.ws_url) as ws:
            start(ws)
            assert_normal_turn(ws)
        wait_idle(server)


def test_a_session_past_its_time_limit_is_closed(silero_vad_path):
    with make_server(silero_vad_path, max_session_s=1.0) as running:
        with connect(running.ws_url) as ws:
            start(ws)
            error = next_error(ws)
            assert error["code"] == "session_expired" and error["fatal"] is True
            assert closed_with(ws) == 1001
        with connect(running.ws_url) as ws:  # the limit is per session: a new one starts afresh
            start(ws)
            assert_normal_turn(ws)
        wait_idle(running)


def test_metrics_count_errors_by_code(server):
    import httpx

    with connect(server.ws_url) as ws:  # an error of its own: the test does not lean on the ones before it
        start(ws)
        ws.send("not json")
        assert next_error(ws)["code"] == "bad_json"
    body = httpx.get(server.url + "/metrics", timeout=30).text
    assert 'voxlane_errors_total{code="bad_json"}' in body
    assert "voxlane_sessions_opened_total" in body and "process_resident_memory_bytes" in body


def test_access_token_in_the_first_message_the_url_or_a_header(silero_vad_path):
    with make_server(silero_vad_path, access_token="s3cret-s3cret-s3cret") as running:
        for url, headers, extra in ((running.ws_url, None, {"token": "s3cret-s3cret-s3cret"}),
                                    (running.ws_url + "?token=s3cret-s3cret-s3cret", None, {}),
                                    (running.ws_url, {"Authorization": "Bearer s3cret-s3cret-s3cret"}, {})):
            with connect(url, additional_headers=headers) as ws:
                start(ws, **extra)
                assert_normal_turn(ws)
        for headers, extra in ((None, {}), (None, {"token": "wrong"}), ({"Authorization": "Bearer wrong"}, {})):
            with connect(running.ws_url, additional_headers=headers) as ws:
                ws.send(json.dumps({"type": "start", "sample_rate": 16000, **extra}))
                assert next_error(ws)["code"] == "unauthorized"
                assert closed_with(ws) == 4001
        wait_idle(running)


def test_token_bucket_and_turn_watch_on_a_fake_clock():
    from app.server.limits import TokenBucket, TurnWatch
    from pipeline import frames as f

    now = [0.0]
    bucket = TokenBucket(rate=2, burst=4, clock=lambda: now[0])
    assert [bucket.take() for _ in range(5)] == [True] * 4 + [False]
    now[0] = 1.0  # two more after a second
    assert [bucket.take() for _ in range(3)] == [True, True, False]

    watch = TurnWatch(timeout_s=5, clock=lambda: now[0])
    watch.on_frame(f.Transcript(gen=1, text="hi", is_final=True))
    now[0] = 5.5
    assert watch.stalled() is None  # 4.5 s without progress
    watch.on_frame(f.SpeakChunk(gen=1, index=0, text="Hello"))
    now[0] = 11.0
    assert watch.stalled() == (1, "tts") and watch.stalled() is None  # reported once
    watch.on_frame(f.SpeechEnded(gen=2))
    now[0] = 20.0
    assert watch.stalled() == (2, "asr")
    for done in (f.TurnDone(gen=3, waterfall={}), f.Interrupt(gen=4, reason="user"),
                 f.Transcript(gen=3, text="", is_final=True)):
        watch.on_frame(f.Transcript(gen=3, text="hello", is_final=True))
        watch.on_frame(done)  # a finished, superseded or empty turn is not watched any more
        now[0] += 100
        assert watch.stalled() is None
    watch.on_frame(f.Interrupt(gen=9, reason="notice"))  # a spoken notice (the apology) is watched from its start
    now[0] += 100
    assert watch.stalled() == (9, "tts")


def test_a_flood_of_idle_connections_is_capped(silero_vad_path):
    import contextlib

    with make_server(silero_vad_path, max_sessions=2, max_pending_sockets=3, max_pending_per_client=3,
                     start_timeout_s=30.0) as running:
        with contextlib.ExitStack() as stack:
            idle = [stack.enter_context(connect(running.ws_url)) for _ in range(3)]  # connected, never started
            with connect(running.ws_url) as ws:
                error = next_error(ws)
                assert error["code"] == "busy" and "max_pending_sockets" in error["message"]
                assert closed_with(ws) == 1013
            idle[0].close()
            deadline = time.monotonic() + 10
            while running.registry.num_pending > 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            with connect(running.ws_url) as ws:  # a place is free again
                start(ws)
                assert_normal_turn(ws)
        wait_idle(running)
