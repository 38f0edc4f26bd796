"""Smart Turn v3.2: loads offline from the installed pipecat-ai wheel (only its ONNX file) and reads
a finished question as more complete than an unfinished one, on real synthesized speech."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from app import model_store
from pipeline.endpointing.smart_turn import SmartTurnModel
from pipeline.endpointing.whisper_features import WINDOW_SAMPLES, log_mel


@pytest.fixture(scope="module")
def smart_turn():
    return SmartTurnModel(model_store.resolve("smart-turn-v3.2", "turn"))


def test_the_model_file_comes_from_the_installed_package_not_a_download():
    path = model_store.resolve("smart-turn-v3.2", "turn")
    assert path.name == "smart-turn-v3.2-cpu.onnx" and "site-packages" in str(path)
    assert model_store.is_ready("smart-turn-v3.2")


def test_our_features_equal_pipecats_numpy_copy():
    # Their file imports only numpy; loaded by path so pipecat's package (and its dependencies) is never imported.
    path = model_store.package_dir("pipecat") / "audio" / "turn" / "smart_turn" / "_whisper_features.py"
    spec = importlib.util.spec_from_file_location("pipecat_whisper_features", path)
    theirs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(theirs)
    audio = np.random.default_rng(0).normal(0, 0.1, WINDOW_SAMPLES).astype(np.float32)
    audio[: WINDOW_SAMPLES // 2] = 0  # a turn shorter than 8 s is zero-padded in front
    np.testing.assert_allclose(log_mel(audio), theirs.compute_whisper_log_mel_features(audio), atol=1e-5)


@pytest.mark.parametrize("complete, unfinished", [
    ("What should I cook for dinner tonight?", "What should I cook for"),
    ("Can you recommend a good book to read?", "Can you recommend a"),
])
def test_a_finished_question_scores_above_an_unfinished_one(smart_turn, say, complete, unfinished):
    p_complete, p_unfinished = smart_turn(say(complete)[0]), smart_turn(say(unfinished)[0])
    assert p_complete > 0.5 > p_unfinished, (p_complete, p_unfinished)


def test_short_and_silent_inputs_give_a_probability(smart_turn):
    for audio in (np.zeros(0, np.float32), np.zeros(1600, np.float32), np.zeros(3 * WINDOW_SAMPLES, np.float32)):
        assert 0.0 <= smart_turn(audio) <= 1.0
