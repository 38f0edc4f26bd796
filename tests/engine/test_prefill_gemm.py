"""The prompt path's matrix product (engine/prefill_gemm.h, used by ``quant_linear`` and the one-call
step for chunks of 9+ rows): each weight format against its pure-torch dequantize-then-matmul twin on
real tensors of the packaged files, at 1 row (the GEMV), 2, 3, 5, 7 and 8 rows (the small-batch paths:
prefill_gemm.h's 512-bit wide_rows where the format has it) and 43 and 300 rows (the GEMM), and
the one-call step's prefill of a long chunk against the same prompt in 8-row chunks."""
from __future__ import annotations

import pytest
import torch

from engine import gguf_formats as fmt
from engine import kernels as K
from engine.kv_cache import KVCache
from engine.loader import load_model
from engine.native_weights import QuantWeight, load_native_model
from engine.quant import quantize_int8, quantize_per_channel
from engine.runner import ModelRunner
from tests.engine.test_native_weights import ops, qwen_tensors, smollm2_tensors  # noqa: F401 (fixtures)

ROWS = (1, 2, 3, 5, 7, 8, 43, 300)


@pytest.fixture(params=["amx", "fma"])
def path(request, ops):
    """Each GEMM path this machine has: AMX bf16 tiles (our int8 weights; activations split hi/lo) and
    the 512-bit FMA tile (every format; and int8 with AMX off)."""
    amx = ops.set_prefill_amx(request.param == "amx")
    if request.param == "amx" and not amx:
        ops.set_prefill_amx(True)
        pytest.skip("no AMX here (or the OS refused its state): the FMA path is the one tested")
    yield request.param
    ops.set_prefill_amx(True)


def check_rows(ops, blocks, format, cols, twin, row_scale=None):
    """``quant_linear`` at each row count against x @ twin.T (+ bias), in float64."""
    g = torch.Generator().manual_seed(format + cols)
    n = twin.shape[0]
    bias = torch.randn(n, generator=g)
    for M in ROWS:
        x = torch.randn(M, cols, generator=g)
        reference = x.double() @ twin.double().T + bias.double()
        got = ops.quant_linear(x, blocks, format, cols, row_scale, bias)
        assert got.shape == (M, n), f"{M} rows"
        scale = reference.abs().max().item()
        assert (got.double() - reference).abs().max().item() < 2e-6 * scale * cols ** 0.5, f"{M} rows"


# 50 weight rows: 12 register tiles of 4 and a tail of 2 in the first panel of 16, and a panel of 2
@pytest.mark.parametrize("name, format", [("blk.0.ffn_down.weight", fmt.Q4_1), ("blk.5.ffn_up.weight", fmt.Q4_1),
                                          ("token_embd.weight", fmt.Q8_0)])
def test_gguf_blocks_at_every_chunk_size(ops, path, smollm2_tensors, name, format):
    weight = smollm2_tensors.quant(name)
    assert weight.format == format
    part = QuantWeight(weight.format, weight.blocks[:50].contiguous(), weight.cols)
    check_rows(ops, part.blocks, part.format, part.cols, part.dequantize())


def test_int8_per_channel_at_every_chunk_size(ops, path, smollm2_tensors):
    """Our per-channel int8 (the default ``quant``) of a real matrix: the row scale is applied to
    each row's sum."""
    w = smollm2_tensors.quant("blk.2.attn_q.weight").dequantize()[:50]
    q, scales = quantize_per_channel(w)
    scales = scales.float()
    check_rows(ops, q.view(torch.uint8), fmt.I8, w.shape[1], q.float() * scales[:, None], scales)


@pytest.mark.parametrize("cols", [576, 568])  # 568 = 35 x 16 + 8: the masked tail of the K loop
def test_fp32_weights_at_every_chunk_size(ops, path, smollm2_tensors, cols):
    w = smollm2_tensors.quant("blk.1.attn_output.weight").dequantize()[:50, :cols].contiguous()
    check_rows(ops, w.view(torch.uint8), fmt.F32, cols, w)


def test_qwen_k_quants_at_every_chunk_size(ops, path, qwen_tensors):
    """Q5_0, Q4_K, Q6_K (Qwen2.5-0.5B's GGUF), when its packages are installed."""
    tensors = qwen_tensors
    for format in (fmt.Q5_0, fmt.Q4_K, fmt.Q6_K):
        name = next(n for n, t in tensors.tensors.items() if t.ggml_type == format and len(t.shape) == 2)
        weight = tensors.quant(name)
        part = QuantWeight(weight.format, weight.blocks[:50].contiguous(), weight.cols)
        check_rows(ops, part.blocks, part.format, part.cols, part.dequantize())


def _prefill(model, prompt, chunk: int):
    """The prompt prefilled by the one-call step in chunks of ``chunk`` rows -> (last logits, keys, values)."""
    cache = KVCache(model.args, 2, 512, torch.float32)
    runner = ModelRunner(model, cache)
    assert runner.fused_decode
    logits = None
    for start in range(0, len(prompt), chunk):
        logits = runner.prefill(1, prompt[start:start + chunk], start)
    n = len(prompt)
    return logits, cache.tensors.k[:, 1, :, :n].clone(), cache.tensors.v[:, 1, :, :n].clone()


@pytest.mark.parametrize("quant", ["int8", "native"])
@pytest.mark.parametrize("length", [43, 300])
def test_one_call_prefill_of_a_long_chunk_equals_8_row_chunks(ops, path, smollm2_dir, quant, length):
    """The real model (the default int8 weights; the GGUF's Q4_1 blocks): a prompt prefilled as one
    chunk (the GEMM) gives the logits and cache of the same prompt in chunks of 8 (the small-batch
    path, itself tested against the generic forward)."""
    if quant == "native":
        model = load_native_model(smollm2_dir, 512, ops)
    else:
        model = load_model(smollm2_dir, torch.float32, 512)
        model.kernels = ops
        quantize_int8(model)
    prompt = [(i * 37) % 4000 + 100 for i in range(length)]
    (l1, k1, v1), (l8, k8, v8) = _prefill(model, prompt, length), _prefill(model, prompt, 8)
    assert (l1 - l8).abs().max().item() < 1e-4 * l8.abs().max().item()
    assert l1.argmax().item() == l8.argmax().item()
    assert (k1 - k8).abs().max().item() < 1e-4 * (1 + k8.abs().max().item())
    assert (v1 - v8).abs().max().item() < 1e-4 * (1 + v8.abs().max().item())


@pytest.mark.parametrize("H, Hkv, d", [(9, 3, 64), (14, 2, 64), (12, 2, 128)])  # SmolLM2, Qwen2.5 0.5B, 1.5B
@pytest.mark.parametrize("window", [0, 100])
def test_attention_over_long_rows_of_keys(ops, H, Hkv, d, window):
    """A prompt's rows attend hundreds of keys: 16 at a time and the weighted values in registers
    (decode_ops.h), against torch, at 300, 37, 16 and 1 keys (tails of 12, 5, 0 and 1 key)."""
    S, L = 4, 320
    g = torch.Generator().manual_seed(H * d + window)
    k_cache, v_cache = torch.randn(S, Hkv, L, d, generator=g), torch.randn(S, Hkv, L, d, generator=g)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    qkv = torch.randn(4, (H + 2 * Hkv) * d, generator=g) * 2
    cos, sin = torch.randn(4, d, generator=g), torch.randn(4, d, generator=g)
    slots, positions = torch.tensor([0, 1, 2, 3]), torch.tensor([299, 36, 15, 0])
    got = ops.decode_attention(qkv, cos, sin, k_cache, v_cache, slots, positions, H, Hkv, window)
    expected = K.decode_attention_reference(qkv, cos, sin, k_ref, v_ref, slots, positions, H, Hkv, window)
    assert (got - expected).abs().max().item() < 1e-5 * (1 + expected.abs().max().item())


@pytest.mark.parametrize("H, Hkv, d", [(9, 3, 64), (14, 2, 64), (12, 2, 128)])  # SmolLM2, Qwen2.5 0.5B, 1.5B
@pytest.mark.parametrize("rows, start", [(43, 0), (300, 0), (16, 0), (5, 0), (3, 0), (29, 37), (17, 290)])
def test_prompt_rows_attend_together(ops, H, Hkv, d, rows, start):
    """A prompt chunk's rows attend 16 at a time (decode_ops.h's attend_rows16: rows as lanes, each key
    read once per 16 rows; what the one-call step runs for chunks of 9+ rows), against torch row by row:
    chunks that start at position 0 and after earlier keys (start), row counts with partial blocks (43,
    29, 17: tails of 11, 13, 1 rows; 3 rows: below kBlockMinRows, row by row), keys in partial blocks of 16,
    and a row of another slot after the chunk (a decode row in the same step: its block goes row by row)."""
    S, L = 3, 320
    g = torch.Generator().manual_seed(H * d + rows + start)
    k_cache, v_cache = torch.randn(S, Hkv, L, d, generator=g), torch.randn(S, Hkv, L, d, generator=g)
    B = rows + 1
    qkv = torch.randn(B, (H + 2 * Hkv) * d, generator=g) * 2
    cos, sin = torch.randn(B, d, generator=g), torch.randn(B, d, generator=g)
    slots = torch.tensor([1] * rows + [2])
    positions = torch.tensor(list(range(start, start + rows)) + [7])
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    got = ops.prompt_attention(qkv, cos, sin, k_cache, v_cache, slots, positions, H, Hkv, 0)
    expected = K.decode_attention_reference(qkv, cos, sin, k_ref, v_ref, slots, positions, H, Hkv, 0)
    assert (got - expected).abs().max().item() < 1e-5 * (1 + expected.abs().max().item())
    assert torch.allclose(k_cache, k_ref, atol=1e-5) and torch.equal(v_cache, v_ref)  # every row's k/v written
