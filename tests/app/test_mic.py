"""``voxlane mic`` with the file-backed device double: a spoken question from a WAV through a
simulated 48 kHz microphone, the real pipeline on the configured default backend (our engine), and
a simulated 48 kHz speaker. One set of models for the module."""
from __future__ import annotations

import numpy as np
import pytest

from app.audio_devices import FileDevices
from app.commands.mic import build_parser, run
from app.config import AppConfig
from app.pipeline_sessions import PipelineSessions

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def factory():
    made = PipelineSessions(AppConfig())  # the configured default backend
    made.warm_up()
    yield made
    made.close()


def test_mic_answers_a_spoken_question_through_a_48k_device(factory, question_wav, capsys):
    devices = FileDevices(question_wav, device_rate_hz=48000, tail_s=3.0)
    result = run(build_parser().parse_args(["--turns", "1"]), devices=devices, factory=factory)
    out = capsys.readouterr().out
    print(out)
    assert result.code == 0
    stats = result.stats
    assert stats.input_rate_hz == stats.output_rate_hz == 48000  # the device's rate, not an assumed 16 kHz
    assert stats.transcripts and "france" in stats.transcripts[0].lower()
    assert stats.replies and stats.replies[0].strip()
    assert "you> " in out
    played = devices.played_audio()
    assert np.abs(played.astype(np.int32)).max() > 1000  # the answer reached the "speaker"
    assert "first_audio_out" in stats.waterfalls[0]["ms"]


@pytest.mark.parametrize("is_gated", [True, False], ids=["echo-gate", "no-gate"])
def test_echo_gate_keeps_the_assistant_from_hearing_itself(factory, question_wav, is_gated):
    """The speakers' sound comes back into the microphone at 0.5x (open speakers, no headphones).
    Ungated, the VAD takes the reply's echo for the user and keeps pausing the reply (measured
    here: a dozen pauses per reply). Gated, the echo never reaches the VAD: no pause, no new turn."""
    devices = FileDevices(question_wav, device_rate_hz=48000, tail_s=8.0, mix_echo=0.5)
    result = run(build_parser().parse_args([] if is_gated else ["--no-echo-gate"]), devices=devices, factory=factory)
    stats = result.stats
    print(f"\n{'gated' if is_gated else 'ungated'}: user turns {stats.transcripts}, playback pauses {stats.num_pauses}, "
          f"interruptions {stats.num_interruptions}"
          + (f", gate suppressed {result.gate.num_suppressed} blocks" if result.gate else ""))
    assert result.code == 0 and stats.replies
    assert "france" in stats.transcripts[0].lower()
    if is_gated:
        assert len(stats.transcripts) == 1 and stats.num_pauses == 0 and stats.num_interruptions == 0
        assert result.gate.num_suppressed > 0
    else:  # the problem the gate solves is real in this simulation
        assert stats.num_pauses > 0 or len(stats.transcripts) > 1
