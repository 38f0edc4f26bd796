"""Faults inside the pipeline, over a real socket: a TTS that raises or stalls, an LLM that raises
or stalls past server.stall_timeout_s, a remote LLM server that refuses connections and then comes
back. Each ends the turn cleanly (an error with a code, then the turn's "turn" message) and the
next turn of the same session works."""
from __future__ import annotations

import threading
import time

import pytest
from fastapi import FastAPI
from websockets.sync.client import connect

from app.openai_api import openai_router
from app.server.runner import BackgroundServer, bind_socket
from engine.backends.remote import RemoteBackend, RemoteSettings
from tests.app.scripted_models import ScriptedLLM, ScriptedTTS, make_server
from tests.app.socket_checks import assert_normal_turn, read_turn, start, turn, wait_idle


class FreezingTTS(ScriptedTTS):
    """Stalls on the word "freeze" until its call is cancelled (at most 30 s), and counts the cancels."""

    def __init__(self):
        self.num_cancelled = 0

    def synthesize(self, text, speaking_rate=1.0, cancel=None):
        if "freeze" in text.lower():
            released = threading.Event()
            cancel.on_cancel(released.set)
            if not released.wait(30):
                return
            self.num_cancelled += 1
            return
        yield from super().synthesize(text, speaking_rate)


@pytest.fixture(scope="module")
def server(silero_vad_path):
    # The stall timeout is what these tests exercise; 3 s, not 1, so a loaded machine's pauses in a
    # normal turn are not taken for a stall.
    with make_server(silero_vad_path, stall_timeout_s=3.0) as running:
        yield running
        running.factory.close()


@pytest.fixture
def freezing_tts(server):
    """A fresh voice for each test, so no count carries over from another test (any order)."""
    server.factory.tts = FreezingTTS()
    return server.factory.tts


def ended_with_error(seen: list[dict]) -> dict:
    """The turn's error; the turn ended (its "turn" message came last) and the state went back to listening."""
    errors = [m for m in seen if m["type"] == "error"]
    assert len(errors) >= 1 and all(not e["fatal"] for e in errors), seen
    assert seen[-1]["type"] == "turn" and seen[-1]["gen"] == errors[0]["gen"], seen
    return errors[0]


@pytest.mark.parametrize("text, code, stage", [
    ("please say kaboom", "pipeline_error", "tts"),  # the TTS raises
    ("LLMFAIL now", "pipeline_error", "llm"),  # the LLM raises before its first token
    ("STALL now", "timeout", "llm"),  # the LLM stops producing: the watchdog ends the turn
    ("freeze now", "timeout", "tts"),  # the TTS stops producing
])
def test_a_failing_stage_ends_the_turn_and_the_next_turn_works(server, freezing_tts, text, code, stage):
    wait_idle(server)
    with connect(server.ws_url, max_size=None) as ws:
        start(ws)
        error = ended_with_error(turn(ws, text))
        assert error["code"] == code and error["stage"] == stage, error
        if code == "timeout":
            assert error["message"].startswith("Sorry")  # shown to the user as the apology
        assert_normal_turn(ws)
        if stage == "tts" and code == "timeout":  # the stalled synthesis was cancelled, not waited for
            assert freezing_tts.num_cancelled == 1
    wait_idle(server)  # the stalled generation was cancelled, its slot and the session's threads freed


APOLOGY = "Sorry, I could not answer in time. Please try again."


def test_an_llm_stall_ends_with_a_spoken_apology(server):
    """Shown with the timeout error, then spoken in the persona's voice as a turn of its own."""
    wait_idle(server)
    with connect(server.ws_url, max_size=None) as ws:
        start(ws)
        error = ended_with_error(turn(ws, "STALL now"))
        assert error["code"] == "timeout" and error["stage"] == "llm" and error["message"].startswith(APOLOGY)
        notice = read_turn(ws)  # right after the stalled turn's "turn" message
        gen = notice[-1]["gen"]
        assert gen > error["gen"] and {"type": "interrupted", "gen": gen, "reason": "notice"} in notice, notice
        assert [m["text"] for m in notice if m["type"] == "speak_chunk"] == [APOLOGY]
        audio = [m for m in notice if m["type"] == "audio"]
        assert audio and all(m["gen"] == gen and m["text"] == APOLOGY for m in audio)
        assert not [m for m in notice if m["type"] in ("error", "assistant_delta")], notice
        assert_normal_turn(ws)
    wait_idle(server)


@pytest.mark.parametrize("text, failed", [
    ("freeze now", None),  # the TTS itself stalled
    ("kaboom, kaboom, kaboom. then STALL", "tts"),  # the TTS failed on the first sentence, then the LLM stalled
])
def test_the_apology_is_only_shown_when_the_voice_stalled_or_failed(server, freezing_tts, text, failed):
    wait_idle(server)
    with connect(server.ws_url, max_size=None) as ws:
        start(ws)
        seen = turn(ws, text)
        errors = [m for m in seen if m["type"] == "error"]
        timeout = next(e for e in errors if e["code"] == "timeout")
        assert timeout["message"].startswith(APOLOGY) and seen[-1] == {**seen[-1], "type": "turn", "gen": timeout["gen"]}
        if failed:
            assert [(e["code"], e["stage"]) for e in errors] == [("pipeline_error", failed), ("timeout", "llm")]
        after = turn(ws, "ping")  # a notice would come before this turn's messages
        assert not [m for m in after if m.get("reason") == "notice" or m["type"] == "speak_chunk"
                    and m["gen"] != after[-1]["gen"]], after
        # The stalled turn was ended by the server, not by a stop from the client.
        assert [m["reason"] for m in seen + after if m["type"] == "interrupted" and m["gen"] > timeout["gen"]
                and m["gen"] < after[-1]["gen"]] == ["timeout"], seen + after
        assert "".join(m["text"] for m in after if m["type"] == "assistant_delta") == "You said: ping."
    wait_idle(server)


@pytest.fixture(scope="module")
def remote_server(silero_vad_path):
    """Our server with the remote (OpenAI-compatible) backend pointed at a port nobody listens on yet."""
    reserved = bind_socket()  # bound, not listening: refused until the upstream server listens on it
    port = reserved.getsockname()[1]
    settings = RemoteSettings(f"http://127.0.0.1:{port}/v1", "scripted", timeout_s=5.0, max_retries=2, backoff_s=0.1)
    with make_server(silero_vad_path) as running:
        running.factory.llm = RemoteBackend(settings)
        running.remote_socket = reserved
        yield running
        running.factory.close()
        running.factory.llm.close()
    reserved.close()


def test_remote_llm_refusing_connections_then_recovering(remote_server):
    upstream_llm = ScriptedLLM()
    upstream = FastAPI()
    upstream.include_router(openai_router(upstream_llm, "scripted"))
    with connect(remote_server.ws_url, max_size=None) as ws:
        start(ws)
        error = ended_with_error(turn(ws, "ping"))  # refused, retried with backoff, then given up cleanly
        assert error["code"] == "pipeline_error" and error["stage"] == "llm"
        assert error["message"].startswith("Sorry") and "Error" not in error["message"], error  # details: log only
        with BackgroundServer(upstream, sock=remote_server.remote_socket):
            assert_normal_turn(ws)  # the remote server is up: the same session answers again
            assert_normal_turn(ws)
    deadline = time.monotonic() + 30
    while remote_server.registry.num_open and time.monotonic() < deadline:
        time.sleep(0.02)
    assert remote_server.registry.num_open == 0 and not remote_server.factory.open_pipelines
    assert upstream_llm.active == 0


def test_a_failing_stage_logs_under_its_session(server):
    """The pipeline's stage threads run in the session's logging context (app/logs.py)."""
    import io
    import logging

    from app.logs import setup_logging

    stream = io.StringIO()
    handler = setup_logging("INFO", stream=stream)
    try:
        with connect(server.ws_url, max_size=None) as ws:
            session = start(ws)["session"]
            ended_with_error(turn(ws, "please say kaboom"))
    finally:
        logging.getLogger().removeHandler(handler)
    lines = [line for line in stream.getvalue().splitlines() if "stage tts failed" in line]
    assert lines and f"session={session} " in lines[0], stream.getvalue()
