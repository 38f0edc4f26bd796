"""Models load at the same time, all or nothing: every load runs and is returned; one that fails
gives one error naming it, and the models that did load are closed (with the real engine: its
stepping thread ends)."""
from __future__ import annotations

import dataclasses
import threading

import pytest

from app.config import AppConfig
from app.parallel_load import ModelLoad, ModelLoadError, load_in_parallel
from app.startup_phases import StartupPhases


def test_every_load_runs_on_its_own_thread_and_is_returned():
    barrier = threading.Barrier(3, timeout=30)  # passes only if all three loads run at the same time

    def load(value):
        def run():
            barrier.wait()
            return value
        return run

    phases = StartupPhases()
    loaded = load_in_parallel({k: ModelLoad(k, load(k.upper())) for k in ("asr", "llm", "vad")}, phases)
    assert loaded == {"asr": "ASR", "llm": "LLM", "vad": "VAD"}
    assert {"load asr", "load llm", "load vad"} <= phases.seconds.keys()


def test_a_failed_load_names_the_model_and_closes_the_others():
    closed = []

    def fail():
        raise OSError("model.bin: no such file")

    loads = {"llm": ModelLoad("LLM (tiny)", lambda: "engine", close=closed.append),
             "asr": ModelLoad("ASR model (whisper-x)", fail),
             "vad": ModelLoad("VAD model (silero)", lambda: "vad")}  # no close: dropping it frees it
    with pytest.raises(ModelLoadError) as raised:
        load_in_parallel(loads)
    assert "could not load the ASR model (whisper-x): OSError: model.bin: no such file" in str(raised.value)
    assert list(raised.value.failed) == ["ASR model (whisper-x)"]
    assert closed == ["engine"]


@pytest.mark.slow
def test_a_broken_model_file_stops_the_real_load_and_the_engine_is_closed(tmp_path):
    from app.voice_models import load_voice_models

    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx model")
    config = AppConfig()
    config = dataclasses.replace(config, models=dataclasses.replace(config.models, turn=str(broken)))
    engines_before = _engine_threads()  # other tests' engines may be alive in this process
    with pytest.raises(ModelLoadError) as raised:
        load_voice_models(config, warm=True)
    assert list(raised.value.failed) == [f"end-of-turn model ({broken})"]
    assert _engine_threads() <= engines_before  # the engine that loaded meanwhile was closed


def _engine_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "voxlane-engine" and t.is_alive()}
