"""``[engine] quant = "auto"``: the engine runs each packaged model with its measured best weights
that run fast on this machine (SmolLM2: its Q4_1 blocks with int16 activations where the kernels
build with VNNI, int8 elsewhere; the Qwen2.5 Q4_K_M files: their own blocks with int8 activations), a
setting the user names stays, and the engine on its own reads "auto" as int8."""
from __future__ import annotations

import pytest

from app import model_store
from app.backends import make_llm_backend
from app.config import load_config
from engine.config import EngineConfig, WeightSetting
from engine.kernels import int16_fast
from engine.native_weights import NativeLinear
from engine.sampling_params import SamplingParams


NATIVE_INT8, NATIVE_INT16 = WeightSetting("native", "int8"), WeightSetting("native", "int16")


def test_auto_takes_the_models_setting_and_a_named_one_stays():
    assert EngineConfig().quant == "auto"
    assert EngineConfig().with_weights(NATIVE_INT8) == EngineConfig(quant="native", int8_activations=True)
    assert EngineConfig().with_weights(NATIVE_INT16) == EngineConfig(quant="native", int16_activations=True)
    assert EngineConfig().with_weights(WeightSetting("native")) == EngineConfig(quant="native")
    assert EngineConfig(quant="int8").with_weights(NATIVE_INT8).quant == "int8"  # the user's choice
    named = EngineConfig(quant="native", int8_activations=False)
    assert named.with_weights(NATIVE_INT16) is named
    # Native blocks need float32 activations: with bfloat16 "auto" is int8, not a config error.
    for setting in (NATIVE_INT8, NATIVE_INT16):
        bf16 = EngineConfig(dtype="bfloat16").with_weights(setting)
        assert (bf16.quant, bf16.int8_activations, bf16.int16_activations, bf16.dtype) == \
            ("int8", False, False, "bfloat16")
    with pytest.raises(ValueError, match="int8_activations: needs quant 'native'"):
        EngineConfig(int8_activations=True)  # "auto" lets the model choose them, not the user
    with pytest.raises(ValueError, match="int16_activations: needs quant 'native'"):
        EngineConfig(int16_activations=True)


def test_a_weight_setting_names_a_real_one():
    with pytest.raises(ValueError, match="quant: must be one of"):
        WeightSetting("auto")  # a setting is what auto becomes
    with pytest.raises(ValueError, match="'int16' is not a setting of quant 'int8'"):
        WeightSetting("int8", "int16")  # activation precisions are the native blocks' only
    with pytest.raises(ValueError, match="'bf16' is not a setting"):
        WeightSetting("native", "bf16")


def test_each_packaged_llm_has_its_measured_setting(monkeypatch):
    for vnni in (True, False):
        monkeypatch.setattr(model_store, "_int16_fast", lambda: vnni)
        # SmolLM2: int16 activations only where they run through VNNI (and the kernels are on).
        assert model_store.engine_weights("smollm2-135m-instruct") == (NATIVE_INT16 if vnni else WeightSetting("int8"))
        assert model_store.engine_weights("smollm2-135m-instruct", kernels=False) == WeightSetting("int8")
        assert model_store.engine_weights("qwen2.5-0.5b-instruct") == NATIVE_INT8
        assert model_store.engine_weights("qwen2.5-1.5b-instruct") == NATIVE_INT8
        assert model_store.engine_weights("someone/SomeModel-1B-Instruct") == WeightSetting("int8")  # not measured


def test_the_question_is_asked_of_the_built_kernels():
    from engine.kernels import load_kernels

    # True exactly when the library was compiled with the VNNI kernel (this CPU's -march=native).
    flags = next((line for line in open("/proc/cpuinfo") if line.startswith("flags")), "").split()
    assert load_kernels() is not None, "the fused kernels build on every supported machine"
    assert int16_fast() == all(f in flags for f in ("avx512f", "avx512bw", "avx512_vnni"))


def _loaded(config):
    backend = make_llm_backend(config)
    try:
        answer = "".join(backend.generate([{"role": "user", "content": "What is the capital of France?"}],
                                          SamplingParams(temperature=0, max_tokens=12)))
        engine = backend.engine  # built by now: the answer came from it
        linears = [m for m in engine.model.modules() if isinstance(m, NativeLinear)]
        packed = sum(part.r16 for m in linears for part in m.parts)  # R16: int16 activations' layout
        return engine.config, engine.model.int8_activations, len(linears), packed, answer
    finally:
        backend.close()


def test_the_shipped_config_runs_qwen_natively_with_int8_activations(qwen05_dir):
    config = load_config(environ={"VOXLANE_MODELS_LLM": "qwen2.5-0.5b-instruct"})
    assert config.engine.quant == "auto"  # voxlane.toml's default
    engine_config, int8_activations, native_linears, packed, answer = _loaded(config)
    assert (engine_config.quant, engine_config.int8_activations, int8_activations) == ("native", True, True)
    assert native_linears > 0 and packed == 0 and "Paris" in answer, answer


def test_the_shipped_config_runs_smollm2_natively_with_int16_activations_where_fast(smollm2_dir):
    engine_config, int8_activations, native_linears, packed, answer = _loaded(load_config(environ={}))
    if int16_fast():
        assert (engine_config.quant, engine_config.int16_activations, int8_activations) == ("native", True, False)
        assert native_linears > 0 and packed >= native_linears  # every matrix (q/k/v/o, gate/up, down) in R16
    else:
        assert (engine_config.quant, int8_activations, native_linears) == ("int8", False, 0)
    assert "Paris" in answer, answer


def test_without_the_fused_kernels_smollm2_stays_int8(smollm2_dir):
    config = load_config(environ={"VOXLANE_ENGINE_KERNELS": "false"})
    engine_config, _, native_linears, packed, answer = _loaded(config)
    assert (engine_config.quant, engine_config.int16_activations, native_linears) == ("int8", False, 0)
    assert "Paris" in answer, answer
