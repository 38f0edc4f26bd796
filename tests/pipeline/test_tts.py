"""TTS backends: Piper (packaged voice), the command-line fallbacks, Coqui (skipped here), the factory."""
from __future__ import annotations

import logging
import sys

import numpy as np
import pytest

from pipeline.persona.persona import Voice
from pipeline.tts import TTSError, TTSProvider, create_tts
from pipeline.tts.base import pcm16_from_wav_bytes
from pipeline.tts.command_tts import CommandTTS


def _total(chunks) -> int:
    return sum(len(c) for c in chunks)


def test_piper_streams_int16_chunks_and_honours_speaking_rate(piper_voice_path):
    tts = create_tts(Voice(backend="piper", voice=str(piper_voice_path)))
    assert tts.name == "piper" and tts.sample_rate == 22050
    normal = list(tts.synthesize("The weather is nice today. Let us go for a walk.", 1.0))
    assert len(normal) == 2  # one chunk per sentence: playback can start after the first
    assert all(c.dtype == np.int16 and c.ndim == 1 for c in normal)
    fast = list(tts.synthesize("The weather is nice today. Let us go for a walk.", 1.5))
    assert _total(fast) < 0.8 * _total(normal)
    assert list(tts.synthesize("   ", 1.0)) == []


def test_piper_variation_zero_reads_the_same_text_the_same_way_every_time(piper_voice_path):
    """A persona's ``voice.variation`` scales the noise Piper samples per synthesis: at 0 the same
    text gives the same samples each time (tests and benchmarks judged by Whisper rely on it); at
    the voice's own 1.0 two readings differ. The provider keeps one backend per variation."""
    text = "What is the capital of France?"
    provider = TTSProvider(lambda spec: piper_voice_path)
    steady = provider(Voice(variation=0.0))
    first, second = (np.concatenate(list(steady.synthesize(text))) for _ in range(2))
    assert np.array_equal(first, second)
    lively = provider(Voice())
    assert lively is not steady and provider(Voice()) is lively
    one, other = (np.concatenate(list(lively.synthesize(text))) for _ in range(2))
    assert len(one) != len(other) or not np.array_equal(one, other)
    with pytest.raises(ValueError, match="variation"):
        Voice(variation=2.0)


@pytest.mark.parametrize("kind", ["flite", "espeak"])
def test_command_fallbacks_speak(kind):
    tts = CommandTTS(kind)
    pcm = np.concatenate(list(tts.synthesize("Hello from the fallback voice.", 1.0)))
    assert pcm.dtype == np.int16 and len(pcm) > 0.5 * tts.sample_rate
    assert np.abs(pcm).max() > 1000  # not silence
    faster = np.concatenate(list(tts.synthesize("Hello from the fallback voice.", 1.6)))
    assert len(faster) < len(pcm)


@pytest.mark.parametrize("kind", ["flite", "espeak"])
def test_command_tts_still_speaks_with_a_neural_voice_name(kind):
    tts = CommandTTS(kind, voice="piper-en_US-joe-medium")  # a persona switched backend but kept its voice
    assert _total(tts.synthesize("Still speaking.", 1.0)) > 0


def test_factory_falls_back_when_the_voice_is_missing(tmp_path):
    tts = create_tts(Voice(backend="piper", voice=str(tmp_path / "missing.onnx")), fallback=("piper", "flite"))
    assert tts.name == "flite"


def test_factory_raises_when_nothing_can_speak(tmp_path):
    with pytest.raises(TTSError):
        create_tts(Voice(backend="piper", voice=str(tmp_path / "missing.onnx")), fallback=())


def test_provider_caches_one_backend_per_voice(piper_voice_path):
    provider = TTSProvider()
    a = provider(Voice(backend="piper", voice=str(piper_voice_path), speaking_rate=1.0))
    b = provider(Voice(backend="piper", voice=str(piper_voice_path), speaking_rate=1.3))
    assert a is b


def test_coqui_backend():
    try:
        import TTS  # noqa: F401
    except Exception as error:
        pytest.skip(f"Coqui `TTS` cannot import here with CPU torch 2.13 ({type(error).__name__}); "
                    "the factory falls back to Piper instead (tested below)")
    from pipeline.tts.coqui_tts import CoquiTTS

    with pytest.raises(TTSError):
        CoquiTTS("/nonexistent/model")


def test_coqui_request_falls_back_to_piper_when_tts_cannot_import(piper_voice_path, monkeypatch, caplog):
    """Whether or not Coqui imports on this machine, the test makes it fail to (``TTS`` is None in
    ``sys.modules``): the persona is then spoken by Piper, the first fallback, with a warning."""
    monkeypatch.setitem(sys.modules, "TTS", None)
    monkeypatch.setitem(sys.modules, "TTS.api", None)
    with caplog.at_level(logging.WARNING, logger="pipeline.tts.factory"):
        tts = create_tts(Voice(backend="coqui", voice="tts_models/en/ljspeech/vits"),
                         resolve=lambda spec: piper_voice_path)
    assert tts.name == "piper"
    assert "Coqui TTS is not importable" in caplog.text and "speaking with piper instead of coqui" in caplog.text
    assert _total(tts.synthesize("Still speaking.", 1.0)) > 0


def test_wav_parser_reads_streamed_wav_with_bogus_sizes():
    pcm = np.arange(-50, 50, dtype=np.int16)
    header = (b"RIFF" + (0x7FFFFFFF).to_bytes(4, "little") + b"WAVE" + b"fmt " + (16).to_bytes(4, "little")
              + (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + (16000).to_bytes(4, "little")
              + (32000).to_bytes(4, "little") + (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
              + b"data" + (0x7FFFFFFF).to_bytes(4, "little"))
    out, rate = pcm16_from_wav_bytes(header + pcm.tobytes())
    assert rate == 16000 and np.array_equal(out, pcm)
