"""``[engine] quant = "auto"``: the engine runs each packaged model with its measured best weights
(SmolLM2: int8; the Qwen2.5 Q4_K_M files: their own blocks with int8 activations), a setting the
user names stays, and the engine on its own reads "auto" as int8."""
from __future__ import annotations

import pytest

from app import model_store
from app.backends import make_llm_backend
from app.config import load_config
from engine.config import EngineConfig
from engine.native_weights import NativeLinear
from engine.sampling_params import SamplingParams


def test_auto_takes_the_models_setting_and_a_named_one_stays():
    assert EngineConfig().quant == "auto"
    assert EngineConfig().with_weights("native", True) == EngineConfig(quant="native", int8_activations=True)
    assert EngineConfig(quant="int8").with_weights("native", True).quant == "int8"  # the user's choice
    named = EngineConfig(quant="native", int8_activations=False)
    assert named.with_weights("native", True) is named
    # Native blocks need float32 activations: with bfloat16 "auto" is int8, not a config error.
    bf16 = EngineConfig(dtype="bfloat16").with_weights("native", True)
    assert (bf16.quant, bf16.int8_activations, bf16.dtype) == ("int8", False, "bfloat16")
    with pytest.raises(ValueError, match="int8_activations: needs quant 'native'"):
        EngineConfig(int8_activations=True)  # "auto" lets the model choose them, not the user


def test_each_packaged_llm_has_its_measured_setting():
    assert model_store.engine_weights("smollm2-135m-instruct") == ("int8", False)
    assert model_store.engine_weights("qwen2.5-0.5b-instruct") == ("native", True)
    assert model_store.engine_weights("qwen2.5-1.5b-instruct") == ("native", True)
    assert model_store.engine_weights("someone/SomeModel-1B-Instruct") == ("int8", False)  # not measured


def _loaded(config):
    backend = make_llm_backend(config)
    try:
        answer = "".join(backend.generate([{"role": "user", "content": "What is the capital of France?"}],
                                          SamplingParams(temperature=0, max_tokens=12)))
        engine = backend.engine  # built by now: the answer came from it
        linears = [m for m in engine.model.modules() if isinstance(m, NativeLinear)]
        return engine.config, engine.model.int8_activations, len(linears), answer
    finally:
        backend.close()


def test_the_shipped_config_runs_qwen_natively_with_int8_activations(qwen05_dir):
    config = load_config(environ={"VOXLANE_MODELS_LLM": "qwen2.5-0.5b-instruct"})
    assert config.engine.quant == "auto"  # voxlane.toml's default
    engine_config, int8_activations, native_linears, answer = _loaded(config)
    assert (engine_config.quant, engine_config.int8_activations, int8_activations) == ("native", True, True)
    assert native_linears > 0 and "Paris" in answer, answer


def test_the_shipped_config_runs_smollm2_in_int8(smollm2_dir):
    engine_config, int8_activations, native_linears, answer = _loaded(load_config(environ={}))
    assert (engine_config.quant, int8_activations, native_linears) == ("int8", False, 0)
    assert "Paris" in answer, answer
