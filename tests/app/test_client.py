"""``voxlane client`` against ``voxlane serve`` running in its own process on the configured default
backend (our engine), as a user runs them: --wav and --text from the command line, --mic with the
file-backed device double, the README's client example, and a clear failure when no server is there."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app.audio_devices import FileDevices
from app.client_mic import run_mic
from app.commands.client import build_parser
from app.server.runner import bind_socket
from pipeline.wavfile import read_wav
from tests.serve_process import ServeProcess
from tests.setup_needs import need_command

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("serve"), "--no-ui") as served:
        yield served


def test_serve_loaded_and_warmed_every_model_before_it_was_ready(server):
    started = [line for line in server.log().splitlines() if 'msg="started in ' in line]
    assert len(started) == 1, server.log()[-3000:]
    for model in ("llm", "asr", "vad", "turn"):
        assert f"load {model} " in started[0] and f"warm {model} " in started[0], started[0]
    assert "load voice 0 " in started[0] and "serving since the process started " in started[0]


@pytest.fixture(scope="module")
def stereo_question_wav(question_wav, tmp_path_factory):
    """The shared spoken question as 44.1 kHz stereo: the client sends any input format."""
    sox = need_command("sox")
    wav = tmp_path_factory.mktemp("client") / "question.wav"
    subprocess.run([sox, str(question_wav), "-r", "44100", "-c", "2", str(wav)], check=True)
    return wav


def _client(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "app", "client", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_server_runs_the_configured_default_engine(server):
    import httpx

    metrics = httpx.get(server.url + "/metrics", timeout=30).text  # the engine's gauges exist only on our engine
    slots = [line for line in metrics.splitlines() if line.startswith("voxlane_engine_kv_slots ")]
    assert slots and float(slots[0].split()[1]) > 0, metrics[-2000:]


def test_client_wav_prints_the_turn_and_writes_the_reply(server, stereo_question_wav, tmp_path):
    out = tmp_path / "reply.wav"
    done = _client("--url", server.ws_url, "--wav", str(stereo_question_wav), "--out", str(out))
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr
    assert "you> " in done.stdout and "france" in done.stdout.lower()
    assert "waterfall (ms from speech_end)" in done.stderr and "first reply audio at this client" in done.stderr
    pcm, rate, channels = read_wav(out)
    assert rate == 22050 and channels == 1 and np.abs(pcm.astype(np.int32)).max() > 1000


def test_client_text_with_a_persona(server):
    done = _client("--url", server.ws_url, "--text", "Say hello.", "--persona", "pirate")
    assert done.returncode == 0, done.stderr
    assert "you> Say hello." in done.stdout
    reply = done.stdout.split("pirate> ", 1)[1]
    assert reply.strip()


def test_client_mic_with_the_device_double(server, stereo_question_wav):
    devices = FileDevices(stereo_question_wav, device_rate_hz=48000, tail_s=3.0)
    args = build_parser().parse_args(["--mic", "--turns", "1"])
    assert asyncio.run(run_mic(server.ws_url, args, devices=devices)) == 0
    assert np.abs(devices.played_audio().astype(np.int32)).max() > 1000


def test_client_without_a_server_says_so():
    with bind_socket() as nobody:  # bound, never listening: the connection is refused
        done = _client("--url", f"ws://127.0.0.1:{nobody.getsockname()[1]}/ws", "--text", "hello", "--timeout", "10")
    assert done.returncode == 1
    assert "cannot talk to" in done.stderr and "Traceback" not in done.stderr


def test_the_readme_client_example_runs_as_printed(server, tmp_path):
    readme = (ROOT / "README.md").read_text()
    code = readme.split("### From your own code", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert len([line for line in code.splitlines() if line.strip()]) == 15  # the README promises fifteen
    script = tmp_path / "example.py"
    script.write_text(code.replace("ws://127.0.0.1:7860/ws", server.ws_url))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()  # the answer's text, streamed
    pcm, rate, channels = read_wav(tmp_path / "reply.wav")
    assert channels == 1 and rate > 0 and len(pcm) > rate // 2 and np.abs(pcm).max() > 1000  # real speech
