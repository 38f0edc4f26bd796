"""PipelineConfig: defaults are valid, problems are reported by dotted key, TOML-shaped dicts build."""
from __future__ import annotations

import pytest

from pipeline.config import ASRConfig, ChunkerConfig, PipelineConfig, TTSConfig, VADConfig
from pipeline.schema import SchemaError, build


def test_defaults_are_valid_and_sane():
    config = PipelineConfig()
    assert config.asr.compute_type == "int8" and config.asr.beam_size == 1
    assert config.chunker.first_max_words < config.chunker.max_words
    assert config.tts.fallback[0] == "piper"


@pytest.mark.parametrize("make, field", [
    (lambda: ASRConfig(compute_type="int4"), "compute_type"),
    (lambda: ASRConfig(beam_size=0), "beam_size"),
    (lambda: VADConfig(threshold=0.4, neg_threshold=0.6), "neg_threshold"),
    (lambda: ChunkerConfig(first_min_words=9, first_max_words=4), "first_min_words"),
    (lambda: TTSConfig(fallback=("piper", "festival")), "fallback"),
])
def test_invalid_values_name_their_field(make, field):
    with pytest.raises(ValueError, match=f"^{field}: "):
        make()


def test_builds_from_a_toml_table_and_reports_keys():
    config = build(PipelineConfig, {"asr": {"compute_type": "int8_float32", "beam_size": 2},
                                    "tts": {"fallback": ["flite"]}}, "voxlane.toml", "pipeline")
    assert config.asr.compute_type == "int8_float32" and config.asr.beam_size == 2 and config.tts.fallback == ("flite",)
    with pytest.raises(SchemaError) as error:
        build(PipelineConfig, {"asr": {"beam_size": 99}, "vad": {"bogus": 1}}, "voxlane.toml", "pipeline")
    keys = [key for key, _ in error.value.problems]
    assert "pipeline.asr.beam_size" in keys and "pipeline.vad.bogus" in keys
