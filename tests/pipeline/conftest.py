"""Session fixtures for the pipeline tests: each model loads once; test audio is synthesized
(Piper, flite) into a session temp dir at test time."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from pipeline.audio import resample_once, to_mono_float32
from pipeline.config import ASRConfig
from pipeline.wavfile import write_wav


@pytest.fixture(scope="session")
def transcriber(whisper_base_dir):
    from pipeline.asr.whisper import WhisperTranscriber

    return WhisperTranscriber(whisper_base_dir, ASRConfig())


@pytest.fixture(scope="session")
def llm(smollm2_dir):
    from engine.backends.reference import TransformersBackend

    backend = TransformersBackend(smollm2_dir, num_threads=2)
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def vad_model(silero_vad_path):
    """One Silero model for every pipeline in the session, as a server shares it."""
    from pipeline.vad.silero import SileroModel

    return SileroModel(silero_vad_path)


@pytest.fixture(scope="session")
def engine_llm(smollm2_dir):
    """Our own engine (the app's default backend)."""
    from engine.backends.engine_backend import EngineBackend

    backend = EngineBackend(smollm2_dir)
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def piper(piper_voice_path):
    """The user's voice in tests: the same audio for the same text in every run (no sampled noise),
    so what Whisper hears of it does not change from run to run."""
    from pipeline.tts.piper_tts import PiperTTS

    return PiperTTS(piper_voice_path, variation=0.0)


@pytest.fixture(scope="session")
def tts_provider(piper_voice_path):
    from pipeline.tts import TTSProvider

    return TTSProvider(lambda spec: piper_voice_path)


@pytest.fixture(scope="session")
def audio_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("voice")


@pytest.fixture(scope="session")
def say(piper, audio_dir):
    """``say(text, engine="piper"|"flite")`` -> (16 kHz mono float32 audio, path of a WAV at the
    engine's own rate). Cached per text."""
    cache: dict[tuple[str, str], tuple[np.ndarray, Path]] = {}

    def make(text: str, engine: str = "piper") -> tuple[np.ndarray, Path]:
        key = (text, engine)
        if key not in cache:
            path = audio_dir / f"{engine}-{len(cache)}.wav"
            if engine == "piper":
                pcm, rate = np.concatenate(list(piper.synthesize(text))), piper.sample_rate
                write_wav(path, pcm, rate)
            else:
                subprocess.run(["flite", "-voice", "kal16", "-t", text, "-o", str(path)], check=True)
                from pipeline.wavfile import read_wav

                pcm, rate, _ = read_wav(path)
            cache[key] = (resample_once(to_mono_float32(pcm), rate, 16000), path)
        return cache[key]

    return make
