"""Attacks that reach our engine (issue 11), over real sockets: a live server whose sessions and
``/v1`` both run on the real engine (SmolLM2-135M int8; scripted ASR and TTS keep it fast)."""
from __future__ import annotations

import json
import threading

import httpx
import pytest
from websockets.sync.client import connect

from engine.config import EngineConfig
from engine.backends.engine_backend import EngineBackend
from tests.app.scripted_models import make_server
from tests.app.socket_checks import read_turn, start

pytestmark = pytest.mark.slow
COUNT = [{"role": "user", "content": "Count from one to thirty in words, separated by commas."}]
RARE = "\u0fd5\u16a0\ua9c1" * 1333  # 3,999 characters, ~3 tokens each: far beyond a 512-token context


@pytest.fixture(scope="module")
def engine_server(silero_vad_path, smollm2_dir):
    engine = EngineBackend(smollm2_dir, EngineConfig(max_seq_len=512, num_slots=8, max_batch_size=8))
    with make_server(silero_vad_path, with_api=True, llm=engine, stall_timeout_s=120.0) as running:
        yield running
        running.factory.close()
    engine.close()


def stream_completion(url: str, out: dict, key: int, **extra) -> None:
    """One streaming request; out[key] = (finish_reason of the last chunk, text, saw [DONE])."""
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", timeout=300,
                          json={"messages": COUNT, "stream": True, "temperature": 0, "max_tokens": 40, **extra}) as r:
            lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        chunks = [json.loads(x) for x in lines if x != "[DONE]"]
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if "choices" in c)
        out[key] = (chunks[-1]["choices"][0]["finish_reason"] if chunks and "choices" in chunks[-1] else None,
                    text, lines[-1:] == ["[DONE]"])
    except Exception as error:  # the assertion below names it
        out[key] = (repr(error), "", False)


TURN_WAIT_S = 300  # per message: on 2 busy cores the engine shares its steps with the test's streams


def typed_turn(ws, text: str) -> list[dict]:
    ws.send(json.dumps({"type": "text", "text": text}))
    return read_turn(ws, text, TURN_WAIT_S)


def test_a_poisoned_request_fails_alone(engine_server):
    """Finding 1: a seed torch refuses, sent among 3 streams and a voice session's turn, failed them
    all (the engine ended every request in flight). Now it is a 400 naming the field at the edge,
    and the 3 streams and the turn finish normally."""
    url, results = engine_server.url, {}
    with connect(engine_server.ws_url, max_size=None) as ws:
        start(ws)
        threads = [threading.Thread(target=stream_completion, args=(url, results, i)) for i in range(3)]
        for thread in threads:
            thread.start()
        ws.send(json.dumps({"type": "text", "text": "Tell me about the sea."}))
        poisoned = httpx.post(url + "/v1/chat/completions", timeout=120,
                              json={"messages": COUNT, "seed": 18446744073709551616, "temperature": 1})
        seen = read_turn(ws, "Tell me about the sea.", TURN_WAIT_S)
        for thread in threads:
            thread.join(timeout=300)
    assert poisoned.status_code == 400 and poisoned.json()["error"]["param"] == "seed", poisoned.text
    for i in range(3):
        finish, text, done = results[i]
        assert finish in ("stop", "length") and text and done, results[i]
    own = [m for m in seen if m.get("gen") == seen[-1]["gen"]]
    assert not [m for m in own if m["type"] == "error"], own
    assert "".join(m["text"] for m in own if m["type"] == "assistant_delta").strip()


def test_finish_reason_says_length_when_max_tokens_ended_it(engine_server):
    """Finding 13: finish_reason was always "stop"."""
    results = {}
    stream_completion(engine_server.url, results, 0, max_tokens=3)
    assert results[0][0] == "length" and results[0][2], results
    reply = httpx.post(engine_server.url + "/v1/chat/completions", timeout=120,
                       json={"messages": COUNT, "temperature": 0, "max_tokens": 3}).json()
    assert reply["choices"][0]["finish_reason"] == "length" and reply["usage"]["completion_tokens"] >= 1
    short = httpx.post(engine_server.url + "/v1/chat/completions", timeout=120,
                       json={"messages": [{"role": "user", "content": "Say OK."}], "temperature": 0,
                             "max_tokens": 200}).json()
    assert short["choices"][0]["finish_reason"] == "stop", short


@pytest.mark.parametrize("content, code", [
    (RARE, "context_length_exceeded"),  # counted in tokens: ~12,000 for a 512-token context
    ("word " * 2000, "context_length_exceeded"),  # 10,000 characters: refused before it is tokenized
])
def test_prompts_too_long_for_the_context_are_400_never_500(engine_server, content, code):
    """Finding 5: a prompt longer than the context answered 500."""
    response = httpx.post(engine_server.url + "/v1/chat/completions", timeout=120,
                          json={"messages": [{"role": "user", "content": content}]})
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert error["code"] == code and error["param"] == "messages", error


def test_a_typed_turn_too_long_for_the_context_gets_a_clear_message(engine_server, log_stream):
    """Finding 12: 4,000 characters of rare symbols became ~12,000 tokens and the client got
    pipeline_error with the exception's text. Now: a clear, generic message; the figures in the log;
    the next turn works."""
    with connect(engine_server.ws_url, max_size=None) as ws:
        start(ws)
        seen = typed_turn(ws, RARE)
        errors = [m for m in seen if m["type"] == "error"]
        assert len(errors) == 1 and errors[0]["code"] == "pipeline_error", errors
        message = errors[0]["message"]
        assert "too long" in message and "Error" not in message and "max_seq_len" not in message, message
        after = typed_turn(ws, "Say hello.")
        assert not [m for m in after if m["type"] == "error"], after
        assert "".join(m["text"] for m in after if m["type"] == "assistant_delta").strip()
    assert "tokens, the model's context 512" in log_stream.getvalue()
