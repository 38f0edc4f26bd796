"""The app config: defaults, the shipped voxlane.toml, environment overrides, keyed errors."""
from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from app.config import AppConfig, load_config
from pipeline.schema import SchemaError

ROOT = Path(__file__).resolve().parents[2]


def _as_toml_data(config: AppConfig) -> dict:
    data = dataclasses.asdict(config)
    data.pop("source")
    return data


def test_shipped_voxlane_toml_documents_exactly_the_defaults():
    shipped = load_config(ROOT / "voxlane.toml", environ={})
    assert _as_toml_data(shipped) == _as_toml_data(AppConfig())
    # every key of every section is written out in the file, so the file is the full documentation
    raw = tomllib.loads((ROOT / "voxlane.toml").read_text())

    def same_keys(written: dict, defaults: dict, where: str) -> None:
        assert set(written) == set(defaults), where
        for key, value in defaults.items():
            if isinstance(value, dict):
                same_keys(written[key], value, f"{where}.{key}")

    same_keys(raw, _as_toml_data(AppConfig()), "voxlane.toml")


def test_defaults_are_safe():
    config = load_config(environ={})
    assert config.server.host == "127.0.0.1"
    assert config.server.max_sessions > 0 and config.server.max_message_bytes > 0


def test_environment_overrides_the_file(tmp_path):
    path = tmp_path / "voxlane.toml"
    path.write_text("[server]\nport = 9000\n")
    config = load_config(path, environ={"VOXLANE_SERVER_PORT": "9100", "VOXLANE_LLM_BACKEND": "transformers"})
    assert config.server.port == 9100
    assert config.llm.backend == "transformers"
    assert "VOXLANE_SERVER_PORT" in config.source


@pytest.mark.parametrize("text, key, words", [
    ("[server]\nport = 70000\n", "server.port", "65535"),
    ("[server]\nport = \"x\"\n", "server.port", "must be int"),
    ("[server]\nhost = \"0.0.0.0\"\n", "server.access_token", "not loopback"),
    ("[serverr]\nport = 1\n", "serverr", "unknown key"),
    ("[models]\nllm = \"whisper-base\"\n", "models.llm", "not a llm model"),
    ("[models]\nasr = \"no-such-model\"\n", "models.asr", "not a packaged model"),
    ("[llm]\nbackend = \"openai\"\n", "llm.base_url", "http"),
    ("[llm]\nbackend = \"gpt\"\n", "llm.backend", "must be one of"),
    ("server = 3\n", "server", "must be a table"),
    ("[engine]\nquant = \"int4\"\n", "engine.quant", "must be one of"),
    ("[engine]\nmax_batch_size = 16\nnum_slots = 8\n", "engine.num_slots", ">= max_batch_size"),
    ("[pipeline.vad]\nthreshold = 2.0\n", "pipeline.vad.threshold", "[0.05, 0.95]"),
    ("[pipeline.tts]\nfallback = [\"sam\"]\n", "pipeline.tts.fallback", "unknown backend"),
    ("[pipeline.llm]\nearly_answer_min_p = 1.5\n", "pipeline.llm.early_answer_min_p", "[0, 1]"),
    ("[server\n", "", "not valid TOML"),
])
def test_invalid_settings_name_the_file_and_key(tmp_path, text, key, words):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SchemaError) as caught:
        load_config(path, environ={})
    message = str(caught.value)
    assert str(path) in message
    assert any(k == key and words in m for k, m in caught.value.problems), caught.value.problems


def test_invalid_environment_value_names_the_variable():
    with pytest.raises(SchemaError) as caught:
        load_config(environ={"VOXLANE_SERVER_PORT": "-1"})
    assert "VOXLANE_SERVER_PORT" in str(caught.value) and "server.port" in str(caught.value)


def test_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(SchemaError, match="file not found"):
        load_config(tmp_path / "nope.toml", environ={})
