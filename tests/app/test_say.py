"""``voxlane say`` writes a WAV that Whisper transcribes back to the same words."""
from __future__ import annotations

import wave

import numpy as np
import pytest

from bench.wer import wer
from tests.app.test_cli import voxlane


@pytest.fixture(scope="module")
def whisper(whisper_base_dir):
    from faster_whisper import WhisperModel

    return WhisperModel(str(whisper_base_dir), device="cpu", compute_type="int8", cpu_threads=2)


def _transcribe(whisper, path) -> str:
    with wave.open(str(path)) as f:
        rate, pcm = f.getframerate(), np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")
    import soxr

    audio = soxr.resample(pcm.astype(np.float32) / 32768.0, rate, 16000)
    segments, _ = whisper.transcribe(audio, language="en", beam_size=1)
    return " ".join(s.text for s in segments)


# Each voice must come back word for word. (The fallbacks are robotic: on "The quick brown fox jumps
# over the lazy dog." Whisper base hears espeak-ng say "jump, so we're gonna lazy dog"; an everyday
# sentence is the fair test of what they are for.)
@pytest.mark.parametrize("backend, rate", [(None, 22050), ("flite", 16000), ("espeak", 22050)])
def test_say_round_trips_through_whisper(tmp_path, whisper, backend, rate):
    text = "Please open the window before the meeting starts."
    out = tmp_path / "out.wav"
    result = voxlane("say", text, "-o", str(out), *(["--backend", backend] if backend else []))
    assert result.returncode == 0, result.stderr
    with wave.open(str(out)) as f:
        assert (f.getnchannels(), f.getsampwidth(), f.getframerate()) == (1, 2, rate)
        assert f.getnframes() > rate  # more than a second of speech
    heard = _transcribe(whisper, out)
    assert wer(text, heard) == 0.0, heard


def test_say_speaking_rate_changes_duration(tmp_path):
    durations = []
    for rate in ("0.8", "1.4"):
        out = tmp_path / f"{rate}.wav"
        assert voxlane("say", "Speaking rate comes from the persona.", "-o", str(out), "--rate", rate).returncode == 0
        with wave.open(str(out)) as f:
            durations.append(f.getnframes() / f.getframerate())
    assert durations[0] > durations[1] * 1.3


def test_say_refuses_empty_text(tmp_path):
    result = voxlane("say", " ", "-o", str(tmp_path / "x.wav"))
    assert result.returncode == 2 and "nothing to say" in result.stderr
