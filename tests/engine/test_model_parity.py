"""Our decoder against transformers on the same weights (fp32)."""
from __future__ import annotations

import pytest
import torch

from engine.loader import load_model
from engine.rope import rope_frequencies


def _prompt_ids(engine) -> list[int]:
    return engine.encode([{"role": "system", "content": "You are Voxlane, a helpful voice assistant."},
                          {"role": "user", "content": "Explain in two sentences why the sky is blue."}])


def test_prefill_logits_match_transformers(fp32_engine, hf_model):
    ids = _prompt_ids(fp32_engine)
    with torch.inference_mode():
        reference = hf_model(torch.tensor([ids])).logits[0]  # [T, V]
        # Every position, through the cache path (slot 5, in two chunks of uneven size).
        model = fp32_engine.model
        runner = fp32_engine.runner
        first = runner.prefill(5, ids[:17], 0, want_logits=True)
        last = runner.prefill(5, ids[17:], 17, want_logits=True)
        full = model.logits(model(torch.tensor([ids]), torch.arange(len(ids))[None]))[0]  # no-cache path
    assert (full - reference).abs().max().item() < 1e-3
    assert (first - reference[16]).abs().max().item() < 1e-3
    assert (last - reference[-1]).abs().max().item() < 1e-3
    assert torch.equal(full.argmax(-1), reference.argmax(-1))


def test_decode_step_logits_match_transformers(fp32_engine, hf_model):
    ids = _prompt_ids(fp32_engine)
    extra = [504, 7000, 314]  # three more tokens, fed one at a time as decode steps
    with torch.inference_mode():
        reference = hf_model(torch.tensor([ids + extra])).logits[0]
        fp32_engine.runner.prefill(6, ids, 0)
        for i, token in enumerate(extra):
            position = len(ids) + i
            logits = fp32_engine.runner.decode([6], [token], [position])[0]
            assert (logits - reference[position]).abs().max().item() < 1e-3


def test_rope_scaling_kinds_match_transformers():
    """Our llama3/linear frequencies equal transformers' for the same config."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for params in ({"rope_type": "linear", "factor": 4.0, "rope_theta": 500000.0},
                   {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192, "rope_theta": 500000.0}):
        config = LlamaConfig(hidden_size=256, num_attention_heads=4, max_position_embeddings=131072,
                             rope_parameters=params)
        ours, factor = rope_frequencies(config, 64)
        theirs, their_factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, torch.device("cpu"))
        assert torch.allclose(ours, theirs.float(), rtol=1e-5), params["rope_type"]
        assert factor == their_factor


def test_qwen2_style_model_matches_transformers(tmp_path):
    """A tiny random Qwen2 (qkv bias, untied head, GQA) saved in HF format loads and matches."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                         max_position_embeddings=128)
    reference = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # random biases, so a missing bias would show
        for layer in reference.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    reference.save_pretrained(tmp_path)
    ours = load_model(tmp_path, torch.float32)
    ids = torch.randint(0, 300, (1, 20))
    with torch.inference_mode():
        expected = reference(ids).logits
        got = ours.logits(ours(ids, torch.arange(20)[None]))
    assert (got - expected).abs().max().item() < 1e-4


@pytest.mark.parametrize("fused", [True, False])
def test_mistral_sliding_window_matches_transformers(tmp_path, fused):
    """A tiny random Mistral with a 5-token sliding window: the no-cache forward, a cached prefill
    and decode steps (fused kernels or the generic masked path) all match transformers over 20
    tokens, i.e. well past the window."""
    from transformers import MistralConfig, MistralForCausalLM

    from engine.kernels import load_kernels
    from engine.kv_cache import KVCache
    from engine.runner import ModelRunner

    torch.manual_seed(0)
    config = MistralConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                           sliding_window=5, tie_word_embeddings=False)
    reference = MistralForCausalLM(config).eval()
    reference.save_pretrained(tmp_path)
    ours = load_model(tmp_path, torch.float32, 64)
    assert ours.args.sliding_window == 5
    ours.kernels = load_kernels() if fused else None
    ids = torch.randint(0, 300, (1, 20))
    with torch.inference_mode():
        expected = reference(ids).logits[0]
        no_cache = ours.logits(ours(ids, torch.arange(20)[None]))[0]
        runner = ModelRunner(ours, KVCache(ours.args, 2, 64, torch.float32))
        assert runner.fused_decode == fused
        prefilled = runner.prefill(1, ids[0, :12].tolist(), 0)
        decoded = [runner.decode([1], [int(ids[0, p])], [p])[0] for p in range(12, 20)]
    assert (no_cache - expected).abs().max().item() < 1e-4
    assert (prefilled - expected[11]).abs().max().item() < 1e-4
    for p, logits in zip(range(12, 20), decoded):
        assert (logits - expected[p]).abs().max().item() < 1e-4, p


def test_gguf_file_loads_directly_like_its_converted_directory(smollm2_dir):
    """``load_model`` on the packaged .gguf itself (transformers dequantizes it, ~15 s) gives the
    model the store's one-time conversion gives: same logits on a real prompt, same tokenizer."""
    from app.model_store import smollm2_gguf_path
    from engine.loader import load_tokenizer

    gguf = smollm2_gguf_path()
    from_gguf, from_dir = load_model(gguf, torch.float32, 256), load_model(smollm2_dir, torch.float32, 256)
    text = "The lighthouse keeper climbed the stairs."
    ids = load_tokenizer(gguf).encode(text)
    assert ids == load_tokenizer(smollm2_dir).encode(text)
    tokens = torch.tensor([ids])
    with torch.inference_mode():
        a = from_gguf.logits(from_gguf(tokens, torch.arange(len(ids))[None]))
        b = from_dir.logits(from_dir(tokens, torch.arange(len(ids))[None]))
    assert (a - b).abs().max().item() < 1e-4
