"""Attacks on the HTTP side of a live server (issue 11), over real sockets, against the real app
(Gradio's routes included) with scripted models: the one gate in front of every route.

Two servers: the default (loopback, no token) and one on a non-loopback address (127.0.0.2)
with ``server.access_token`` set, as someone would run it for others.
"""
from __future__ import annotations

import json
import logging
import socket
import time

import httpx
import pytest
from websockets.sync.client import connect

from tests.app.scripted_models import make_server
from tests.app.socket_checks import LogLines, closed_with, next_error, start

TOKEN = "tok-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def guarded(silero_vad_path):
    """On 127.0.0.2 with a token, the Gradio page and /v1 mounted."""
    with make_server(silero_vad_path, with_ui=True, with_api=True, host="127.0.0.2",
                     access_token=TOKEN,
                     allowed_origins=("http://app.example",)) as running:
        yield running
        running.factory.close()


@pytest.fixture(scope="module")
def local(silero_vad_path):
    """The default: loopback, no token, the Gradio page mounted."""
    with make_server(silero_vad_path, with_ui=True) as running:
        yield running
        running.factory.close()


def raw_request(server, head: str, body: bytes = b"", read_timeout_s: float = 30.0) -> bytes:
    """Sends ``head`` (and ``body``) on a fresh socket; returns what the server answers before it
    closes or goes quiet for ``read_timeout_s``."""
    with socket.create_connection((server.host, server.port), timeout=read_timeout_s) as sock:
        sock.sendall(head.encode() + body)
        answer = b""
        try:
            while b"\r\n\r\n" not in answer:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        except TimeoutError:
            pass
        return answer


# --- finding 3: the token guards Gradio's routes; uploads capped; no remote fetches ----------------

@pytest.mark.parametrize("path", ["/", "/config", "/gradio_api/info", "/gradio_api/openapi.json", "/openapi.json",
                                  "/static/voxlane.js", "/metrics"])
def test_every_route_needs_the_token(guarded, path):
    refused = httpx.get(guarded.url + path, timeout=30)
    assert refused.status_code == 401, (path, refused.status_code, refused.text[:200])
    allowed = httpx.get(guarded.url + path, headers=AUTH, timeout=30)
    assert allowed.status_code in (200, 404), (path, allowed.status_code)  # 404: Gradio 6 has no /openapi.json


def test_uploads_need_the_token_and_are_capped(guarded):
    """An upload above max_body_bytes (2 MiB against 1) gets its 413 every time: the gate reads and drops the
    refused body before answering (gate.DRAIN_LIMITS), where closing on its unread bytes reset the connection
    and the client lost the answer (1 in ~20 of these uploads)."""
    files = {"files": ("a.txt", b"x" * (64 << 10))}
    assert httpx.post(guarded.url + "/gradio_api/upload", files=files, timeout=30).status_code == 401
    big = {"files": ("a.txt", b"x" * (2 << 20))}
    codes = [httpx.post(guarded.url + "/gradio_api/upload", files=big, headers=AUTH, timeout=60).status_code
             for _ in range(40)]
    assert codes == [413] * 40


def test_gradio_file_route_never_fetches_a_url(guarded):
    for target in ("https://example.com/", "http://127.0.0.1:1/x", "HTTP://example.com"):
        response = httpx.get(f"{guarded.url}/gradio_api/file={target}", headers=AUTH, timeout=30)
        assert response.status_code == 403 and "does not fetch" in response.text, (target, response.text)


# --- finding 4: bodies are judged by their announced size and the token before they are read -------

def test_a_body_without_the_token_is_refused_before_it_is_sent(guarded):
    """20 MiB announced, not one byte of it sent: the 401 comes at once (a route that parsed it
    first would wait for the body)."""
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.2:{guarded.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {20 << 20}\r\n\r\n")
    assert raw_request(guarded, head).startswith(b"HTTP/1.1 401")


def test_a_body_above_the_limit_is_refused_before_it_is_sent(guarded):
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.2:{guarded.port}\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {24 << 20}\r\n\r\n")
    assert raw_request(guarded, head).startswith(b"HTTP/1.1 413")


def test_a_streamed_body_is_cut_at_the_limit(guarded):
    """Chunked, no length announced: past ~1 MiB the server reads and drops up to 4 MiB (gate.DRAIN_LIMITS x
    max_body_bytes), then answers 413 while the client still sends."""
    with socket.create_connection((guarded.host, guarded.port), timeout=30) as sock:
        sock.sendall(f"POST /gradio_api/upload HTTP/1.1\r\nHost: 127.0.0.2:{guarded.port}\r\n"
                     f"Authorization: Bearer {TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        chunk = b"10000\r\n" + b"x" * 0x10000 + b"\r\n"  # 64 KiB chunks
        answer, sent = b"", 0
        try:
            while sent < (64 << 20) and not answer:
                sock.sendall(chunk)
                sent += 0x10000
                sock.setblocking(False)
                try:
                    answer = sock.recv(4096)
                except BlockingIOError:
                    pass
                sock.setblocking(True)
        except (BrokenPipeError, ConnectionResetError):
            pass
        sock.settimeout(30)
        answer = answer or sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:100]
    # Refused while the client was still sending (what it wrote beyond the limit sat in socket buffers).
    assert sent < 64 << 20


# --- finding 6: DNS rebinding -------------------------------------------------------------------

def test_a_rebound_host_gets_nothing(local):
    """A page on evil.example whose name now resolves to 127.0.0.1: its requests carry
    ``Host: evil.example:PORT`` and its own origin."""
    evil = f"evil.example:{local.port}"
    for path in ("/healthz", "/", "/config"):
        response = httpx.get(local.url + path, headers={"Host": evil, "Origin": f"http://{evil}"}, timeout=30)
        assert response.status_code == 403 and "allowed_hosts" in response.text, (path, response.status_code)
    with connect(f"ws://{evil}/ws", origin=f"http://{evil}",
                 sock=socket.create_connection(("127.0.0.1", local.port), timeout=30)) as ws:
        error = next_error(ws)
        assert error["code"] == "forbidden_host" and error["fatal"], error
        assert closed_with(ws) == 4003


def test_the_origin_is_compared_with_the_servers_own_not_with_host(local):
    """Same-host pages on another port (another local app) are foreign too."""
    with connect(local.ws_url, origin="http://127.0.0.1:1") as ws:
        assert next_error(ws)["code"] == "forbidden_origin"
    with connect(local.ws_url, origin=f"http://localhost:{local.port}") as ws:  # the page's own origin
        assert start(ws)["type"] == "ready"


def test_configured_host_names_are_accepted(silero_vad_path):
    with make_server(silero_vad_path, allowed_hosts=("voxlane.lan",)) as running:
        ok = httpx.get(running.url + "/healthz", headers={"Host": f"voxlane.lan:{running.port}"}, timeout=30)
        refused = httpx.get(running.url + "/healthz", headers={"Host": "other.lan"}, timeout=30)
        assert (ok.status_code, refused.status_code) == (200, 403)
        running.factory.close()


# --- finding 7: one CORS policy -----------------------------------------------------------------

def test_cors_preflight_answers_only_configured_origins(guarded):
    ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type"}
    foreign = httpx.options(guarded.url + "/v1/chat/completions", headers={"Origin": "http://evil.example", **ask},
                            timeout=30)
    assert foreign.status_code == 403
    assert not [h for h in foreign.headers if h.startswith("access-control-")], foreign.headers
    allowed = httpx.options(guarded.url + "/v1/chat/completions", headers={"Origin": "http://app.example", **ask},
                            timeout=30)
    assert allowed.status_code == 204 and allowed.headers["access-control-allow-origin"] == "http://app.example"
    assert "access-control-allow-credentials" not in allowed.headers
    simple = httpx.get(guarded.url + "/config", headers={"Origin": "http://app.example", **AUTH}, timeout=30)
    assert simple.headers["access-control-allow-origin"] == "http://app.example"
    assert "access-control-allow-credentials" not in simple.headers  # Gradio's own CORS headers are gone


def test_local_preflight_from_a_foreign_page_is_refused(local):
    foreign = httpx.options(local.url + "/healthz", headers={"Origin": "http://evil.example",
                                                             "Access-Control-Request-Method": "POST"}, timeout=30)
    assert foreign.status_code == 403 and "access-control-allow-credentials" not in foreign.headers


# --- finding 9: the token never reaches the log; the page takes it from the fragment --------------

def test_the_token_is_never_logged(guarded):
    records = LogLines()
    loggers = [logging.getLogger(n) for n in ("uvicorn.access", "uvicorn.error")]
    levels = [logger.level for logger in loggers]  # logging is per process: another server may have set warning
    for logger in loggers:
        logger.addHandler(records)
        logger.setLevel(logging.INFO)
    try:
        httpx.get(f"{guarded.url}/healthz?token={TOKEN}", timeout=30)
        with connect(f"{guarded.ws_url}?token={TOKEN}") as ws:
            assert start(ws)["type"] == "ready"
        deadline = time.monotonic() + 30
        while len([x for x in records.lines if "/ws" in x or "/healthz" in x]) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)  # uvicorn logs the WebSocket line from its own loop
    finally:
        for logger, level in zip(loggers, levels):
            logger.removeHandler(records)
            logger.setLevel(level)
    logged = "\n".join(records.lines)
    assert "/healthz" in logged and "/ws" in logged, logged  # the lines are there...
    assert TOKEN not in logged, logged  # ...without the token


def test_the_token_page_trades_the_fragment_for_a_cookie(guarded):
    """Without the token a browser gets a small page (the fragment never reaches the server);
    it posts the token to /auth, whose cookie then opens every route and /ws."""
    page = httpx.get(guarded.url + "/", headers={"Accept": "text/html"}, timeout=30)
    assert page.status_code == 401 and "#token=" in page.text and "replaceState" in page.text
    assert httpx.post(guarded.url + "/auth", headers={"Authorization": "Bearer wrong-token-0123456"},
                      timeout=30).status_code == 401
    granted = httpx.post(guarded.url + "/auth", headers=AUTH, timeout=30)
    assert granted.status_code == 204
    cookie = granted.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
    jar = {"voxlane_token": cookie.split(";")[0].split("=", 1)[1]}
    assert httpx.get(guarded.url + "/config", cookies=jar, timeout=30).status_code == 200
    with connect(guarded.ws_url, additional_headers={"Cookie": f"voxlane_token={jar['voxlane_token']}"}) as ws:
        assert start(ws)["type"] == "ready"  # no token in "start": the cookie carried it


# --- finding 11: slow-loris ------------------------------------------------------------------------

def test_half_sent_requests_are_closed_and_open_connections_are_capped(silero_vad_path):
    with make_server(silero_vad_path, header_timeout_s=1.0, max_connections=20, max_sessions=4) as running:
        lorises = []
        for _ in range(40):  # half a request line each, never finished
            sock = socket.create_connection((running.host, running.port), timeout=30)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            lorises.append(sock)
        try:
            closed = 0
            for sock in lorises:  # every one is closed by the server: beyond the cap at once, the rest at 1 s
                try:
                    data = sock.recv(4096)
                    closed += data == b"" or data.startswith(b"HTTP/1.1 503")
                except ConnectionResetError:
                    closed += 1
                except TimeoutError:  # still open after 30 s
                    pass
            assert closed == len(lorises)
            assert httpx.get(running.url + "/healthz", timeout=30).status_code == 200  # and it serves again
        finally:
            for sock in lorises:
                sock.close()
        running.factory.close()


# --- finding 13: a token that guards nothing ------------------------------------------------------

@pytest.mark.parametrize("token", [" ", "short-token", " padded-token-0123456 "])
def test_serve_refuses_a_blank_or_short_token(token):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, VOXLANE_SERVER_ACCESS_TOKEN=token)
    done = subprocess.run([sys.executable, "-m", "app", "serve", "--host", "127.0.0.2"],
                          cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "access_token" in done.stderr and "16" in done.stderr, done.stderr
