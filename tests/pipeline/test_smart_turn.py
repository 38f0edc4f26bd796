"""Smart Turn v3.2: loads offline from the installed pipecat-ai wheel (only its ONNX file) and reads
a finished question as more complete than an unfinished one, on real synthesized speech."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from app import model_store
from pipeline.audio import resample_once, to_mono_float32
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


PAIRS = [("What should I cook for dinner tonight?", "What should I cook for"),
         ("Can you recommend a good book to read?", "Can you recommend a"),
         ("What is the capital of Spain?", "What is the capital of"),
         ("Remind me to buy milk tomorrow morning.", "Remind me to")]


def test_a_finished_question_scores_above_the_same_question_cut_mid_sentence(smart_turn, piper, transcriber):
    """Each question said whole, and the same audio cut where the unfinished words end (Whisper's
    word timestamps, as ``voxlane bench turns`` cuts it): the prosody of a sentence stopped midway,
    which is what a thinking pause sounds like. Piper samples its voice's noise anew every call, so
    one cut alone swings (0.01 to 0.95 measured); two takes of each, compared on average: whole
    questions 0.94-0.97 (each above 0.8), cut ones 0.47-0.61 (6 runs of these 8 takes)."""
    from bench.turn_set import cut_point

    whisper = transcriber.model  # the session's Whisper: its word timestamps place the cut
    whole, cut = [], []
    for complete, unfinished in PAIRS:
        for _ in range(2):
            pcm = np.concatenate(list(piper.synthesize(complete)))
            audio = resample_once(to_mono_float32(pcm), piper.sample_rate, 16000)
            whole.append(smart_turn(audio))
            cut.append(smart_turn(audio[:cut_point(audio, complete, unfinished, whisper)]))
    print(f"\nwhole {np.round(whole, 2)}\ncut   {np.round(cut, 2)}")
    assert min(whole) > 0.5
    assert np.mean(cut) < np.mean(whole) - 0.2


def test_short_and_silent_inputs_give_a_probability(smart_turn):
    for audio in (np.zeros(0, np.float32), np.zeros(1600, np.float32), np.zeros(3 * WINDOW_SAMPLES, np.float32)):
        assert 0.0 <= smart_turn(audio) <= 1.0
