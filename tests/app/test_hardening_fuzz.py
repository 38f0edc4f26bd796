"""Property-based fuzzing of the protocol (hypothesis, derandomized so every run is the same):
random JSON, random text frames and random binary frames after "start". Whatever arrives, the
server answers only with known, non-fatal error codes, the session then answers a normal turn,
and every pipeline, thread and LLM slot is freed afterwards."""
from __future__ import annotations

import json

import pytest

from tests.setup_needs import need_module  # noqa: E402

hypothesis = need_module("hypothesis", "the test extra: pip install -e .[test]")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from app.server.protocol import ErrorCode  # noqa: E402
from tests.app.scripted_models import make_server  # noqa: E402
from tests.app.socket_checks import num_threads, start, wait_idle  # noqa: E402

CODES = {v for k, v in vars(ErrorCode).items() if k.isupper()}
TYPES = ["start", "text", "interrupt", "persona", "played", "dance", "", None, 5]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)
protocol_like = st.builds(
    lambda kind, extra: json.dumps({"type": kind, **extra}),
    st.sampled_from(TYPES),
    st.dictionaries(st.sampled_from(["text", "persona", "gen", "samples", "sample_rate", "version", "token", "x"]),
                    json_values, max_size=3))
frames = st.one_of(
    protocol_like,
    json_values.map(json.dumps),
    st.text(max_size=300),
    st.binary(max_size=3000),
)


@pytest.fixture(scope="module")
def server(silero_vad_path):
    with make_server(silero_vad_path, max_messages_per_s=1000.0) as running:
        yield running
        running.factory.close()


def ping(ws) -> list[dict]:
    """A typed turn; the JSON messages up to its own "turn" (earlier turns' messages may interleave)."""
    ws.send(json.dumps({"type": "text", "text": "ping"}))
    seen, gen = [], None
    while True:
        message = ws.recv(timeout=30)
        if isinstance(message, bytes):
            continue
        seen.append(json.loads(message))
        last = seen[-1]
        if last["type"] == "transcript" and last["final"] and last["text"] == "ping":
            gen = last["gen"]
        if last["type"] == "turn" and gen is not None and last["gen"] == gen:
            return [m for m in seen if m.get("gen") in (gen, None) or m["type"] == "error"]


def test_random_frames_get_known_codes_and_the_session_goes_on(server):
    wait_idle(server)
    baseline = num_threads()

    @settings(max_examples=60, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(frames, min_size=1, max_size=5))
    def check(messages):
        with connect(server.ws_url, max_size=None) as ws:
            start(ws)
            for message in messages:
                ws.send(message)
            seen = ping(ws)
        errors = [m for m in seen if m["type"] == "error"]
        assert all(e["code"] in CODES and e["fatal"] is False for e in errors), errors
        reply = "".join(m["text"] for m in seen if m["type"] == "assistant_delta")
        assert reply == "You said: ping.", seen

    check()
    wait_idle(server, baseline)
