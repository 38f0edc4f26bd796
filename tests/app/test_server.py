"""The one-port app without models: /healthz, the Gradio page with the widget, its static files,
and ``voxlane serve``'s argument checks."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from app.config import AppConfig
from app.server.app import create_app
from app.server.runner import BackgroundServer
from tests.app.test_protocol_errors import ScriptedFactory

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server():
    with BackgroundServer(create_app(AppConfig(), ScriptedFactory(), with_ui=True)) as running:
        yield running


def test_healthz(server):
    health = httpx.get(server.url + "/healthz", timeout=30).json()
    assert health == {"status": "ok", "protocol": 1, "sessions": 0, "max_sessions": 8, "personas": ["nova", "pirate"]}


def test_the_page_carries_the_widget_and_loads_nothing_from_outside(server):
    page = httpx.get(server.url + "/", timeout=30)
    assert page.status_code == 200
    config = httpx.get(server.url + "/config", timeout=30).json()  # Gradio's page description
    text = page.text + str(config)
    assert "vx-root" in text and "/static/voxlane.js" in text
    assert "fonts.googleapis.com" not in text  # system fonts only: the page works offline


@pytest.mark.parametrize("name", ["voxlane.js", "voxlane-audio.js", "capture-worklet.js", "playback-worklet.js",
                                  "voxlane.css"])
def test_static_files_are_served(server, name):
    response = httpx.get(f"{server.url}/static/{name}", timeout=30)
    assert response.status_code == 200 and len(response.text) > 100


def test_serve_refuses_a_bad_port():
    done = subprocess.run([sys.executable, "-m", "app", "serve", "--port", "70000"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "port" in done.stderr


def test_serve_refuses_a_public_host_without_a_token():
    done = subprocess.run([sys.executable, "-m", "app", "serve", "--host", "0.0.0.0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "access_token" in done.stderr


def test_extra_routes_need_the_access_token_when_one_is_set():
    from fastapi import APIRouter

    from app.config import ServerConfig

    router = APIRouter(prefix="/v1")
    router.get("/models")(lambda: {"data": []})
    config = AppConfig(server=ServerConfig(access_token="s3cret-s3cret-s3cret"))
    with BackgroundServer(create_app(config, ScriptedFactory(), with_ui=False, routers=(router,))) as running:
        assert httpx.get(running.url + "/v1/models", timeout=30).status_code == 401
        authorized = httpx.get(running.url + "/v1/models", headers={"Authorization": "Bearer s3cret-s3cret-s3cret"}, timeout=30)
        assert authorized.status_code == 200 and authorized.json() == {"data": []}


def test_metrics_endpoint_counts_sessions_and_needs_the_token_when_set():
    import json

    from websockets.sync.client import connect

    from app.config import ServerConfig

    config = AppConfig(server=ServerConfig(access_token="s3cret-s3cret-s3cret"))
    with BackgroundServer(create_app(config, ScriptedFactory(), with_ui=False)) as running:
        assert httpx.get(running.url + "/metrics", timeout=30).status_code == 401
        with connect(running.ws_url + "?token=s3cret-s3cret-s3cret") as ws:
            ws.send(json.dumps({"type": "start", "sample_rate": 16000}))
            assert json.loads(ws.recv(timeout=30))["type"] == "ready"
            ws.send(json.dumps({"type": "text", "text": "hi"}))
            while True:
                message = ws.recv(timeout=30)
                if isinstance(message, str) and json.loads(message)["type"] == "turn":
                    break
        response = httpx.get(running.url + "/metrics", headers={"Authorization": "Bearer s3cret-s3cret-s3cret"}, timeout=30)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    assert "voxlane_sessions_opened_total 1.0" in response.text
    assert 'voxlane_turns_total{kind="text"} 1.0' in response.text


def test_server_log_lines_name_their_session(log_stream):
    import json

    from websockets.sync.client import connect

    with BackgroundServer(create_app(AppConfig(), ScriptedFactory(), with_ui=False)) as running:
        with connect(running.ws_url) as ws:
            ws.send(json.dumps({"type": "start", "sample_rate": 16000}))
            session = json.loads(ws.recv(timeout=30))["session"]
    assert f'session={session} msg="session {session} started (persona nova, input 16000 Hz)"' in log_stream.getvalue()


def test_the_output_pump_logs_under_its_session(log_stream):
    import json

    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    class BrokenFactory(ScriptedFactory):
        def open(self, persona, session_id):
            conversation = super().open(persona, session_id)
            conversation.next_frame = lambda timeout_s: 1 / 0  # the pump's own failure, logged by the pump thread
            return conversation

    with BackgroundServer(create_app(AppConfig(), BrokenFactory(), with_ui=False)) as running:
        with connect(running.ws_url) as ws:
            ws.send(json.dumps({"type": "start", "sample_rate": 16000}))
            session = json.loads(ws.recv(timeout=30))["session"]
            assert json.loads(ws.recv(timeout=30))["code"] == "internal"
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=30)
            assert closed.value.rcvd.code == 1011
    assert f'logger=app.server.session session={session} msg="session {session}: output pump failed"' in log_stream.getvalue()
