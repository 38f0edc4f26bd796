"""The device layer without models: the echo gate's decisions, the playback buffer's barge-in
flush, the messages when there is no PortAudio or no device, and PortAudio for real through
ALSA (a file-backed PCM: this machine has no sound card and no snd-aloop)."""
from __future__ import annotations

import builtins
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from app import audio_devices
from app.audio_devices import AudioDeviceError, DeviceInfo, require_devices
from app.commands.mic import build_parser, run
from app.echo_gate import EchoGate
from app.playback_buffer import PlaybackBuffer
from tests.setup_needs import need_module

ROOT = Path(__file__).resolve().parents[2]


def _tone(level: float, n: int = 320) -> np.ndarray:
    return (level * 32767 * np.sin(np.arange(n) / 4)).astype(np.int16)


def test_echo_gate_silences_echo_but_lets_a_louder_voice_barge_in():
    gate = EchoGate(barge_in_ratio=2.0)
    assert np.array_equal(gate.process(_tone(0.1)), _tone(0.1))  # nothing playing: everything passes
    gate.played(_tone(0.3))
    assert not gate.process(_tone(0.15)).any()  # quieter than the playback: echo
    assert np.array_equal(gate.process(_tone(0.9)), _tone(0.9))  # three times louder: the user barging in
    assert gate.num_suppressed == 1 and gate.num_passed_during_playback == 1


def test_playback_buffer_resamples_and_flushes_on_barge_in():
    buffer = PlaybackBuffer(48000)
    buffer.push(1, _tone(0.5, 2205), 22050)  # 0.1 s at 22.05 kHz -> ~4800 samples at 48 kHz
    assert 4000 < buffer.num_buffered <= 4800
    first = buffer.read(960)
    assert np.abs(first.astype(np.int32)).max() > 1000
    assert buffer.heard[1] == pytest.approx(960 * 22050 / 48000)  # counted in the turn's own rate
    buffer.flush(2)  # turn 2 interrupts turn 1: its rest is dropped at once
    assert buffer.num_buffered == 0 and not buffer.read(960).any()
    buffer.push(1, _tone(0.5, 2205), 22050)  # a late chunk of the interrupted turn is ignored
    assert buffer.num_buffered == 0


def test_no_portaudio_is_a_clear_message(monkeypatch):
    real_import = builtins.__import__

    def failing_import(name, *args, **kwargs):
        if name == "sounddevice":
            raise OSError("PortAudio library not found")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", failing_import)
    with pytest.raises(AudioDeviceError, match="libportaudio2"):
        audio_devices.SoundDevices()


def test_no_device_is_a_clear_message_before_loading_models(capsys):
    class NoDevices:
        def list(self):
            return [DeviceInfo(0, "HDMI", 0, 2, 48000)]

    assert run(build_parser().parse_args([]), devices=NoDevices()).code == 2
    assert "no input (microphone) sound device" in capsys.readouterr().err
    with pytest.raises(AudioDeviceError):
        require_devices([])


ASOUNDRC = """
pcm.vxout {{ type file slave.pcm "null" file "{out}" format "raw" }}
pcm.vxin {{ type file slave.pcm "null" file "/dev/null" infile "{inp}" format "raw" }}
pcm.!default {{ type asym playback.pcm "vxout" capture.pcm "vxin" }}
"""

PROBE = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    from app.audio_devices import SoundDevices
    devices = SoundDevices()
    names = [d.name for d in devices.list()]
    got = []
    stream = devices.open_input("default", 16000, 20, lambda block, rate: got.append(block))
    while sum(len(b) for b in got) < 16000:
        time.sleep(0.01)
    stream.close()
    tone = (8000 * np.sin(np.arange(441) / 3)).astype(np.int16)
    out = devices.open_output("default", 22050, 20, lambda n: np.resize(tone, n))
    time.sleep(0.3)
    out.close()
    mic = np.concatenate(got)[:16000]
    print(json.dumps({"names": names, "rate": stream.rate_hz, "mic_peak": int(np.abs(mic).max())}))
""")


def test_portaudio_for_real_through_an_alsa_file_device(tmp_path):
    """Real PortAudio streams (device listing, rate negotiation, capture and playback callbacks)
    against ALSA's file plugin. The null PCM under it has no clock, so this checks the data path,
    not real-time behaviour; the conversation itself is tested with FileDevices."""
    need_module("sounddevice", "PortAudio: apt-get install libportaudio2")
    inp, out = tmp_path / "in.raw", tmp_path / "out.raw"
    (8000 * np.sin(np.arange(48000) / 5)).astype("<i2").tofile(inp)
    (tmp_path / ".asoundrc").write_text(ASOUNDRC.format(out=out, inp=inp))
    env = dict(os.environ, HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert "default" in probe["names"] and probe["rate"] == 16000
    assert probe["mic_peak"] > 7000  # the file's tone came through the capture callback
    played = np.fromfile(out, dtype="<i2")
    assert played.size and np.abs(played.astype(np.int32)).max() > 7000  # the output callback's tone was written
