"""Shared fixtures: the packaged models, resolved once per test session (offline)."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from pathlib import Path

import pytest

from app import model_store


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """HF-format directory (config, tokenizer, fp32 safetensors) of the packaged SmolLM2-135M-Instruct."""
    return model_store.resolve("smollm2-135m-instruct", "llm")


@pytest.fixture(scope="session")
def qwen05_dir() -> Path:
    """The packaged Qwen2.5-Coder-0.5B-Instruct: joined GGUF, config, tokenizer, int8 checkpoint."""
    return model_store.resolve("qwen2.5-0.5b-instruct", "llm")


@pytest.fixture(scope="session")
def whisper_base_dir() -> Path:
    return model_store.resolve("whisper-base", "asr")


@pytest.fixture(scope="session")
def piper_voice_path() -> Path:
    return model_store.resolve("piper-en_US-joe-medium", "tts")


@pytest.fixture(scope="session")
def silero_vad_path() -> Path:
    return model_store.resolve("silero-vad", "vad")
