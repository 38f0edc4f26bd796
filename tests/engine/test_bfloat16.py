"""``[engine] dtype = "bfloat16"``: activations and the KV cache in bfloat16 (half the cache's
memory), on the default INT8 weights. Greedy answers mostly start as the fp32-activation engine's
do; bf16 keeps 8 bits of mantissa, so some part at once (measured: "Name three colours." ->
"There are no three colours." in bf16, "The most obvious colour is white" in fp32)."""
from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams
from tests.engine.conftest import GREEDY_PROMPTS


@pytest.fixture(scope="module")
def bf16_engine(smollm2_dir):
    engine = LLMEngine(smollm2_dir, EngineConfig(dtype="bfloat16", quant="int8", max_seq_len=512,
                                                 admission_window_ms=0), background=False)
    yield engine
    engine.close()


def greedy(engine, prompt, num_tokens: int = 6) -> list[int]:
    stream = engine.submit(prompt, SamplingParams(temperature=0.0, max_tokens=num_tokens))
    engine.run_until_idle()
    return stream.output_ids


def test_bfloat16_keeps_the_cache_in_bf16_and_answers_like_fp32(bf16_engine, int8_engine):
    assert bf16_engine.kv_cache.tensors.k.dtype == torch.bfloat16
    k = bf16_engine.kv_cache.tensors.k  # same slots and length as int8_engine's, half an fp32 cache's bytes
    assert k.shape == int8_engine.kv_cache.tensors.k.shape and bf16_engine.kv_cache.nbytes == 2 * k.numel() * 2
    same_start = 0
    for prompt in GREEDY_PROMPTS:
        ours, reference = greedy(bf16_engine, prompt), greedy(int8_engine, prompt)
        print(f"{prompt[-1]['content']!r}: bf16 {bf16_engine.tokenizer.decode(ours)!r}, "
              f"fp32 {int8_engine.tokenizer.decode(reference)!r}")
        same_start += ours[:3] == reference[:3]
    assert same_start >= 2, same_start
    answer = bf16_engine.tokenizer.decode(greedy(bf16_engine, GREEDY_PROMPTS[0], 12))
    assert "Paris" in answer
