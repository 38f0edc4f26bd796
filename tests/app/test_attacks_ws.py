"""Attacks on ``/ws`` of a live server (issue 11), over real sockets, against the real pipeline with
scripted models: what a socket that never shows the token can cost everyone else."""
from __future__ import annotations

import contextlib
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.app.scripted_models import make_server
from tests.app.socket_checks import assert_normal_turn, closed_with, next_error, start, wait_idle

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "tok-0123456789abcdef"


def healthz_median_ms(url: str, n: int = 25) -> float:
    times = []
    with httpx.Client(timeout=60) as client:
        for _ in range(n):
            t0 = time.perf_counter()
            assert client.get(url + "/healthz").status_code == 200
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


@contextlib.contextmanager
def pre_start_flood(url: str, attackers: int = 4):
    """Sockets that never send "start", each sending 1 MiB text frames of nested empty lists (and
    reconnecting when closed), from another process so their own CPU is not this test's GIL, at a
    low priority: on 2 cores, what is measured is the flood's cost to the server, not the CPU the
    attacker's own process takes from it."""
    process = subprocess.Popen(["nice", "-n", "10", sys.executable, "-m", "tests.app.attack_figures", "--url", url, "--attack-only",
                                "--attackers", str(attackers)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "flooding"  # its first frame went out
        yield
    finally:
        process.kill()
        process.wait(timeout=30)


def test_a_pre_start_flood_leaves_healthz_and_other_sessions_alone(silero_vad_path):
    """Finding 2. Parsing 1 MiB of JSON per frame on the event loop took /healthz from 3 ms to
    ~860 ms and another session's turn from 0.7 s to 22 s. The bound on /healthz is the issue's
    50 ms, or 4x this run's own baseline on a machine too loaded for that; the other session's turn
    must end normally (no stall of its pipeline past stall_timeout_s, no error)."""
    with make_server(silero_vad_path, stall_timeout_s=3.0, start_timeout_s=5.0, max_message_bytes=1 << 20) as running:
        baseline_ms = healthz_median_ms(running.url)
        with connect(running.ws_url, max_size=None) as ws:
            start(ws)
            assert_normal_turn(ws)  # warm
            with pre_start_flood(running.url):
                flood_ms = healthz_median_ms(running.url)
                own = assert_normal_turn(ws)  # no "timeout" error, the whole reply, its audio
        print(f"\n/healthz median {baseline_ms:.1f} ms alone, {flood_ms:.1f} ms under the flood; "
              f"turn during the flood: {own[-1]['waterfall']['ms']}")
        assert flood_ms < max(50.0, 4 * baseline_ms), (baseline_ms, flood_ms)
        wait_idle(running)
        running.factory.close()


def test_limits_per_phase(silero_vad_path):
    """Before "start" a text frame may hold a few KiB; after it, text frames what a text turn
    needs (64 KiB); audio goes on up to max_message_bytes."""
    with make_server(silero_vad_path) as running:
        with connect(running.ws_url, max_size=None) as ws:
            ws.send(json.dumps({"type": "start", "sample_rate": 16000, "persona": "x" * 5000}))
            error = next_error(ws)
            assert error["code"] == "message_too_large" and "before 'start'" in error["message"]
            assert closed_with(ws) == 1009
        with connect(running.ws_url, max_size=None) as ws:
            start(ws)
            ws.send(b"\x00\x00" * 100_000)  # 200 KB of audio: fine
            ws.send(json.dumps({"type": "played", "gen": 0, "samples": 0, "pad": "x" * 70_000}))
            error = next_error(ws)
            assert error["code"] == "message_too_large" and "text message" in error["message"]
            assert closed_with(ws) == 1009
        wait_idle(running)
        running.factory.close()


def test_a_socket_that_keeps_talking_without_start_is_closed_on_time(silero_vad_path):
    """start_timeout_s bounds the whole phase before "start", not each message: a socket sending a
    refused message every 0.2 s is closed all the same."""
    with make_server(silero_vad_path, start_timeout_s=1.0) as running:
        with connect(running.ws_url) as ws:
            fatal = None
            for _ in range(100):  # 20 s of refused messages if nothing closed the socket
                try:
                    ws.send(json.dumps({"type": "text", "text": "hi"}))
                    while fatal is None:
                        message = json.loads(ws.recv(timeout=0.2))
                        fatal = message if message["fatal"] else None
                except TimeoutError:
                    continue
                except ConnectionClosed:
                    break
                if fatal is not None:
                    break
            else:
                raise AssertionError("the socket was never closed")
            assert fatal is None or fatal["code"] == "not_started", fatal
            if fatal is not None:
                assert closed_with(ws) == 1008
            assert (ws.close_code, ws.close_reason) == (1008, "no 'start' message in time")
        wait_idle(running)
        running.factory.close()


def test_idle_sockets_without_the_token_cannot_take_a_session(silero_vad_path):
    """Finding 8. 64 idle token-less sockets made a client with the token get "busy". Not-started
    sockets have their own small cap, in all and per client address, and a session's place is
    taken only when "start" is accepted."""
    with make_server(silero_vad_path, host="127.0.0.2", access_token=TOKEN, max_sessions=2,
                     start_timeout_s=60.0) as running:
        with contextlib.ExitStack() as stack:
            idle, refused = [], 0
            for _ in range(64):  # from 127.0.0.1
                ws = stack.enter_context(connect(running.ws_url, open_timeout=30))
                try:
                    message = json.loads(ws.recv(timeout=0.5))
                    assert message["code"] == "busy" and "max_pending_per_client" in message["message"], message
                    refused += 1
                except TimeoutError:
                    idle.append(ws)
            assert len(idle) == 8 and refused == 56
            # Someone with the token, from another address, still gets in: twice (max_sessions = 2).
            for _ in range(2):
                sock = socket.create_connection((running.host, running.port), timeout=30,
                                                source_address=("127.0.0.3", 0))
                ws = stack.enter_context(connect(running.ws_url, sock=sock))
                assert start(ws, token=TOKEN)["type"] == "ready"
                assert_normal_turn(ws)
            assert running.registry.num_open == 2 and running.registry.num_pending == 8
        wait_idle(running)
        running.factory.close()


def test_a_json_integer_of_4300_digits_is_bad_json(silero_vad_path):
    """Finding 10: the parser's refusal was a plain ValueError that closed the session as
    "internal" (1011) with a traceback in the log."""
    with make_server(silero_vad_path) as running:
        with connect(running.ws_url) as ws:
            start(ws)
            ws.send('{"type": "played", "gen": 1, "samples": ' + "7" * 4301 + "}")
            error = next_error(ws)
            assert error["code"] == "bad_json" and error["fatal"] is False, error
            assert_normal_turn(ws)
        wait_idle(running)
        running.factory.close()
