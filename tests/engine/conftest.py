"""Engine fixtures: engines are loaded once per test session and stepped by the tests
(``background=False``) unless a test needs the real background thread."""
from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import LLMEngine

GREEDY_PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "Name three colours."}],
]


@pytest.fixture(scope="session", autouse=True)
def _two_threads():
    torch.set_num_threads(2)


@pytest.fixture(scope="session")
def fp32_engine(smollm2_dir) -> LLMEngine:
    """Exact mode (fp32, no quantization, an fp32 KV cache), small cache, stepped by the test."""
    engine = LLMEngine(smollm2_dir, EngineConfig(dtype="float32", quant="none", kv_cache_dtype="float32",
                                                 max_seq_len=512, num_slots=8, max_batch_size=8,
                                                 admission_window_ms=0), background=False)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def int8_engine(smollm2_dir) -> LLMEngine:
    """The default mode (int8 weights, fp32 activations), stepped by the test."""
    engine = LLMEngine(smollm2_dir, EngineConfig(dtype="float32", quant="int8", max_seq_len=512,
                                                 admission_window_ms=0), background=False)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def hf_model(smollm2_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
