"""The ``voxlane`` command, run as a user runs it: a real process, real models, offline."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]


def voxlane(*args: str, input: str | None = None, env: dict | None = None, timeout: float = 300):
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, input=input, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})


def test_help_explains_every_subcommand():
    result = voxlane("--help")
    assert result.returncode == 0
    listed = {line.split()[0] for line in result.stdout.splitlines() if line.startswith("    ") and line.split()}
    for command in ("serve", "chat", "say", "models", "personas", "doctor", "converse", "client", "mic", "bench"):
        assert command in listed, command


def test_chat_answers_with_real_tokens_from_the_packaged_model():
    result = voxlane("chat", "--greedy", "What is the capital of France?")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


def test_chat_on_the_reference_backend():
    """The transformers reference backend keeps an end-to-end test of its own; every other
    end-to-end test runs on the configured default, our engine."""
    result = voxlane("chat", "--backend", "transformers", "--greedy", "What is the capital of France?")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


def test_chat_keeps_a_conversation_read_from_stdin():
    result = voxlane("chat", "--greedy", "--max-tokens", "30", input="My name is Ada.\nWhat is my name?\n")
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.split("\n", 1)
    assert first.strip() and "Ada" in second  # the second answer saw the first turn ...
    alone = voxlane("chat", "--greedy", "--max-tokens", "30", "What is my name?")
    assert "Ada" not in alone.stdout  # ... which is where the name came from


def test_chat_refuses_an_unknown_persona_and_an_invalid_config(tmp_path):
    result = voxlane("chat", "--persona", "ghost", "hello")
    assert result.returncode == 2 and "no persona named 'ghost'" in result.stderr
    bad = tmp_path / "voxlane.toml"
    bad.write_text("[llm]\ntimeout_s = 0\n")
    result = voxlane("--config", str(bad), "chat", "hello")
    assert result.returncode == 2
    assert "refusing to start" in result.stderr and "llm.timeout_s" in result.stderr and str(bad) in result.stderr


def test_models_list_and_path():
    listing = voxlane("models", "list")
    assert listing.returncode == 0
    for name in ("whisper-base", "whisper-tiny.en", "smollm2-135m-instruct", "piper-en_US-joe-medium", "silero-vad"):
        assert name in listing.stdout
    path = voxlane("models", "path", "whisper-tiny.en")
    assert path.returncode == 0 and (Path(path.stdout.strip()) / "model.bin").exists()
    offline = voxlane("models", "pull", "Qwen/Qwen2.5-0.5B-Instruct")
    assert offline.returncode == 2 and "use a packaged model" in offline.stderr


def test_personas_commands(tmp_path):
    listing = voxlane("personas", "list")
    assert listing.returncode == 0 and "professor" in listing.stdout and "pirate" in listing.stdout
    show = voxlane("personas", "show", "pirate")
    assert show.returncode == 0 and "Captain Flint" in show.stdout and "speaking_rate" in show.stdout
    assert voxlane("personas", "validate").returncode == 0
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "X"\nsystem_prompt = "y"\n[voice]\nspeaking_rate = 9\n')
    result = voxlane("personas", "validate", str(bad))
    assert result.returncode == 1 and "voice.speaking_rate" in result.stdout


def test_personas_list_says_why_a_file_was_rejected(tmp_path):
    (tmp_path / "ada.toml").write_text('name = "Ada"\nsystem_prompt = "You are Ada."\n')
    (tmp_path / "broken.toml").write_text('name = "Broken"\nsystem_prompt = "x"\n[voice]\nspeaking_rate = 9\n')
    listing = voxlane("personas", "list", env={"VOXLANE_PERSONAS_USER_DIR": str(tmp_path)})
    assert listing.returncode == 0, listing.stderr
    lines = {line.split()[0]: line for line in listing.stdout.splitlines() if line.strip()}
    assert "INVALID" not in lines["ada"] and "INVALID" not in lines["nova"]
    broken = listing.stdout[listing.stdout.index("\nbroken "):][:400]  # its line, and the reasons under it
    assert "INVALID" in broken and str(tmp_path / "broken.toml") in broken
    assert "voice.speaking_rate" in broken and "[0.5, 2.0]" in broken


@pytest.mark.slow
def test_bench_latency_in_a_quick_form_reports_every_stage():
    """``voxlane bench latency`` (the README's headline figures), one question and one barge-in:
    its JSON has every stage of the waterfall, the voice-to-voice figure, the ASR check and the
    barge-in figures, measured on the default backend."""
    result = voxlane("bench", "latency", "--questions", "1", "--barge-in", "1", "--json", timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout)
    print(json.dumps({k: data[k] for k in ("conditions", "voice_to_voice_ms", "stages_ms_from_vad_speech_end",
                                           "wer")}, indent=1))
    assert data["conditions"]["llm_backend"] == "engine"
    stages = data["stages_ms_from_vad_speech_end"]
    for stage in ("turn_end_detected", "asr_final", "llm_first_token", "first_chunk_ready", "first_audio_out"):
        assert stages[stage]["n"] == 1 and stages[stage]["p50"] >= 0, (stage, stages)
    assert data["voice_to_voice_ms"]["n"] == 1 and data["voice_to_voice_ms"]["p50"] > 0
    assert data["wer"] <= 0.2  # "What is the capital of France?" heard (six words)
    assert data["reused"]["asr_final_reused"] == 1  # read at the first silent frame, not again at the pause
    assert data["reused"]["early_answer_adopted"] in (0, 1)  # (whether a partial had every word is timing)
    barge_in = data["barge_in"]
    assert barge_in["stop_ms"]["n"] == 1 and barge_in["llm_cancel_ms"]["n"] == 1 and barge_in["vad_detect_ms"]["n"] == 1


def test_doctor_reports_each_check():
    result = voxlane("doctor")
    for name in ("python", "torch", "config", "PortAudio", "model llm", "port"):
        assert f"] {name}" in result.stdout, name
    # this machine has everything the required checks need (./dev setup installed it)
    assert result.returncode == 0, result.stdout
