"""The packaged Qwen2.5-0.5B (Qwen2: q/k/v biases, RoPE base 1e6, 14 query / 2 kv heads, untied head,
152k vocabulary, ChatML) on our engine: logits against transformers on the same dequantized
weights, and the int8 engine from the prepared checkpoint answering through its chat template."""
from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.gguf_file import GGUFFile
from engine.gguf_weights import read_gguf_weights
from engine.loader import chat_prompt_ids, load_config, load_tokenizer, model_from_hf_weights
from engine.sampling_params import SamplingParams

MESSAGES = [{"role": "system", "content": "You are Nova, a friendly voice assistant. Answer in one short sentence."},
            {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def qwen_fp32_pair(qwen05_dir):
    """(ours, transformers' Qwen2ForCausalLM) on the same fp32 tensors, dequantized once from the GGUF."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = load_config(qwen05_dir)
    hf_weights = read_gguf_weights(GGUFFile(qwen05_dir / "model.gguf"))
    ours = model_from_hf_weights(config, hf_weights, torch.float32, 256)
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(qwen05_dir), dtype=torch.float32)
    reference.load_state_dict(hf_weights, strict=True, assign=True)
    reference.model.rotary_emb.inv_freq = ours.inv_freq.clone()  # a buffer the checkpoint does not hold
    return ours, reference.eval()


def test_qwen2_logits_match_transformers(qwen_fp32_pair, qwen05_dir):
    ours, reference = qwen_fp32_pair
    assert ours.args.qkv_bias and not ours.args.tie_embeddings and ours.args.num_kv_heads == 2
    ids = chat_prompt_ids(load_tokenizer(qwen05_dir), MESSAGES)
    from bench.quality import one_slot_runner

    with torch.inference_mode():
        expected = reference(torch.tensor([ids])).logits[0]  # [T, V]
        full = ours.logits(ours(torch.tensor([ids]), torch.arange(len(ids))[None]))[0]
        runner = one_slot_runner(ours, len(ids) + 2)  # the cache path, in two chunks, then one decode step
        runner.prefill(0, ids[:20], 0, want_logits=False)
        last = runner.prefill(0, ids[20:-1], 20)
        step = runner.decode([0], [ids[-1]], [len(ids) - 1])[0]
    scale = expected.abs().max().item()
    assert (full - expected).abs().max().item() < 1e-4 * scale
    assert (last - expected[-2]).abs().max().item() < 1e-4 * scale
    assert (step - expected[-1]).abs().max().item() < 1e-4 * scale
    assert torch.equal(full.argmax(-1), expected.argmax(-1))


def test_int8_engine_answers_from_the_prepared_checkpoint(qwen05_dir):
    engine = LLMEngine(qwen05_dir, EngineConfig(max_seq_len=256, num_slots=1, max_batch_size=1,
                                                admission_window_ms=0), background=False)
    try:
        assert engine.weight_bytes < 700e6  # int8: 630 MB for 630 M weights (untied head and embedding)
        assert 151645 in engine.eos_ids  # <|im_end|>
        stream = engine.submit(MESSAGES, SamplingParams(temperature=0.0, max_tokens=24))
        engine.run_until_idle()
        assert "Paris" in stream.text()
        assert stream.finish_reason == "stop"  # ended by <|im_end|>, not by the token limit
    finally:
        engine.close()
