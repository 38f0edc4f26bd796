"""AMX int8 tiles for int8-activation prompt chunks (engine/q8_matmul.h's amx::q8_weights): from 16
activation rows on, the Q8_0 / Q4_0 / Q5_0 / Q4_1 / Q4_K / Q6_K weights multiply the Q8 activation
blocks in TDPBSSD / TDPBUSD tiles, one product per 32-weight sub-block (Q6_K: two, one per 16-weight
scale), with the scales applied in fp32 as the vector path does. Each format's tiles at 16, 43 and 512 rows against the torch twin (x quantized
to Q8 blocks, the file's dequantized weights) and against the vector path (AMX off) on real tensors
of the packaged Qwen2.5-0.5B and SmolLM2 files; the one-call step's prefill with the tiles against
the same step on the vector path; decoding batches (< 16 rows) untouched."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine import gguf_formats as fmt
from engine.kv_cache import KVCache
from engine.native_weights import QuantWeight, load_native_model
from engine.runner import ModelRunner
from tests.engine.test_bf16_activations import random_blocks
from tests.engine.test_int8_activations import quantize_q8_twin
from tests.engine.test_native_weights import ops, qwen_dir, qwen_tensors, smollm2_tensors  # noqa: F401 (fixtures)

ROWS = (16, 43, 512)
TILE_FORMATS = (fmt.Q8_0, fmt.Q4_0, fmt.Q5_0, fmt.Q4_1, fmt.Q4_K, fmt.Q6_K)


def _cpu_has_amx_int8() -> bool:
    try:
        return any(line.startswith("flags") and " amx_int8" in line
                   for line in Path("/proc/cpuinfo").read_text().splitlines())
    except OSError:
        return False


def tiles_or_skip(ops, format):
    """Skip only where the CPU has no AMX-INT8; where it has it, the tiles must run (a refusal of the
    tile state by the OS, or a build without them, fails instead of hiding the path)."""
    if not _cpu_has_amx_int8():
        pytest.skip("this CPU has no AMX-INT8 (no amx_int8 in /proc/cpuinfo): int8 activations use the vector path")
    assert ops.set_prefill_amx(True), "amx_int8 in /proc/cpuinfo but the tiles do not run (OS refused their state?)"
    assert ops.q8_activation_tiles(format), f"{fmt.NAMES[format]}: no int8 tile path"


@pytest.fixture
def vector_path(ops):
    """Runs a block with AMX off (the vector int8 path, dot_rows_q8), then turns it back on."""
    class Switch:
        def __call__(self, fn):
            ops.set_prefill_amx(False)
            try:
                return fn()
            finally:
                ops.set_prefill_amx(True)
    yield Switch()
    ops.set_prefill_amx(True)


def check_tiles(ops, vector_path, weight: QuantWeight, rows=ROWS):
    """Tiles against the float64 twin (float tolerance, as test_int8_activations' vector path) and
    against the vector path itself: a few fp32 roundings apart, and not bit-equal (another summation
    order: the tiles really ran)."""
    twin = weight.dequantize().double()
    g = torch.Generator().manual_seed(weight.format * 3 + weight.cols)
    bias = torch.randn(weight.rows, generator=g)
    for M in rows:
        x = torch.randn(M, weight.cols, generator=g)
        reference = quantize_q8_twin(x).double() @ twin.T + bias.double()
        got = ops.quant_linear_q8(x, weight.blocks, weight.format, weight.cols, bias)
        vector = vector_path(lambda: ops.quant_linear_q8(x, weight.blocks, weight.format, weight.cols, bias))
        scale = reference.abs().max().item()
        bound = 2e-6 * scale * weight.cols ** 0.5
        assert (got.double() - reference).abs().max().item() < bound, f"{M} rows"
        assert (got - vector).abs().max().item() < bound, f"{M} rows"
        assert not torch.equal(got, vector), f"{M} rows: the vector path's bits (tiles not used?)"


QWEN_NAMES = ["blk.0.ffn_gate.weight", "blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.1.attn_v.weight",
              "blk.2.ffn_down.weight", "blk.0.ffn_down.weight"]


@pytest.mark.parametrize("name", QWEN_NAMES)
def test_qwen_tensors(ops, vector_path, qwen_tensors, name):
    """Qwen2.5-0.5B's prompt matrices: Q5_0 (gate/up, q/k/o, half the v), Q8_0 (the other v), Q4_K and
    Q6_K (the down, half each); 99 rows: 6 panels of 16 and one of 3 (the A tile's zero rows)."""
    weight = qwen_tensors.quant(name)
    tiles_or_skip(ops, weight.format)
    check_tiles(ops, vector_path, QuantWeight(weight.format, weight.blocks[:99].contiguous(), weight.cols))


def test_qwen_has_the_formats(qwen_tensors):
    assert {qwen_tensors.tensors[n].ggml_type for n in QWEN_NAMES} == {fmt.Q5_0, fmt.Q8_0, fmt.Q4_K, fmt.Q6_K}


@pytest.mark.parametrize("name", ["blk.0.ffn_down.weight", "blk.5.ffn_up.weight", "token_embd.weight"])
def test_smollm2_tensors(ops, vector_path, smollm2_tensors, name):
    """SmolLM2's Q4_1 matrices (K = 576: 18 sub-blocks, an even count; 1536: 48) and its Q8_0 embedding."""
    weight = smollm2_tensors.quant(name)
    tiles_or_skip(ops, weight.format)
    check_tiles(ops, vector_path, QuantWeight(weight.format, weight.blocks[:50].contiguous(), weight.cols))


@pytest.mark.parametrize("format", [fmt.Q4_0, fmt.Q5_0, fmt.Q4_1])
def test_odd_sub_block_count(ops, vector_path, format):
    """K = 608: 19 sub-blocks (the pair loop's lone last product); Q4_0, which no packaged file uses."""
    tiles_or_skip(ops, format)
    check_tiles(ops, vector_path, random_blocks(format, 37, 608, seed=format), rows=(16, 17, 43))


def test_every_byte_value(ops, vector_path):
    """Random bytes in every field (Q8_0's -128, Q5_0's 31, Q4_K's 63 scales and mins, Q6_K's 63 and -128
    scales) times activations
    that quantize to +-127: the extreme byte products (Q8_0 as the signed q through TDPBSSD) equal the
    exact product of the file's values."""
    from tests.engine.test_int8_activations import FP16_FIELDS

    for format in TILE_FORMATS:
        tiles_or_skip(ops, format)
        fields, size = FP16_FIELDS[format]
        qk = fmt.GEOMETRY[format][0]
        g = torch.Generator().manual_seed(format)
        K, N = (2048 if qk == 256 else 59 * 32), 24
        blocks = torch.randint(0, 256, (N, K // qk, size), generator=g, dtype=torch.uint8)
        for at in fields:
            sign = torch.where(torch.rand(N, K // qk, generator=g) < 0.5, -0.5, 0.5)
            blocks[:, :, at: at + 2] = sign.to(torch.float16).view(torch.uint8).reshape(N, K // qk, 2)
        weight = QuantWeight(format, blocks.reshape(N, -1).contiguous(), K)
        x = torch.where(torch.rand(20, K, generator=g) < 0.5, -1.0, 1.0)
        exact = x.double() @ weight.dequantize().double().T
        got = ops.quant_linear_q8(x, weight.blocks, format, K, None)
        assert (got.double() - exact).abs().max().item() < 1e-5 * exact.abs().max().item(), fmt.NAMES[format]


# ---- the one-call step ------------------------------------------------------------------------------

def _prefill(ops, model, prompt, amx: bool):
    ops.set_prefill_amx(amx)
    try:
        runner = ModelRunner(model, KVCache(model.args, 2, 512, torch.float32))
        logits = runner.prefill(0, prompt, 0)
        assert runner.fused_decode
        cache = runner.kv_cache.tensors
        return logits, torch.stack([cache.k[:, 0, :, :len(prompt)], cache.v[:, 0, :, :len(prompt)]])
    finally:
        ops.set_prefill_amx(True)


def _mean_off(a, b):
    return (a - b).abs().mean().item()


def check_prefill(ops, model_dir, lengths):
    """A prompt as one chunk through the one-call step with int8 activations, tiles against the vector
    path, with the fp32-activation step as the yardstick. Layer 0's k/v come from the input norm and
    one qkv product, so they agree to fp32 rounding (measured ~1e-5 of the vector path's off the fp32
    step's). Later layers cannot: each matmul's output is quantized again for the next one, and where
    the two summation orders put a value on either side of a Q8 rounding boundary one q differs by 1;
    the differences grow layer by layer (Qwen, 43 tokens, mean |k/v| off against the fp32-activation
    step's: layer 1 1/18, layer 2 1/2, as the bf16-activation tiles' test saw). So layer 1 is held to
    1/4 of the yardstick, the logits to 3 % of their largest and the same last-row argmax."""
    model = load_native_model(model_dir, 512, ops)
    for length in lengths:
        prompt = [(i * 37) % 4000 + 100 for i in range(length)]
        model.int8_activations = False
        fp32, fp32_kv = _prefill(ops, model, prompt, True)
        model.int8_activations = True
        vector, vector_kv = _prefill(ops, model, prompt, False)
        tiles, tiles_kv = _prefill(ops, model, prompt, True)
        assert _mean_off(tiles_kv[:, 0], vector_kv[:, 0]) < 1e-3 * _mean_off(fp32_kv[:, 0], vector_kv[:, 0]), length
        assert not torch.equal(tiles_kv[:, 0], vector_kv[:, 0]), f"{length}: the vector path's bits (tiles not used?)"
        assert _mean_off(tiles_kv[:, 1], vector_kv[:, 1]) < 0.25 * _mean_off(fp32_kv[:, 1], vector_kv[:, 1]), length
        assert (tiles - vector).abs().max().item() < 0.03 * vector.abs().max().item(), length
        assert torch.equal(tiles[-1].argmax(), vector[-1].argmax()), length


def test_one_call_prefill_qwen(ops, qwen_dir):
    tiles_or_skip(ops, fmt.Q5_0)
    check_prefill(ops, qwen_dir, (16, 43, 300))


def test_one_call_prefill_smollm2(ops, smollm2_dir):
    tiles_or_skip(ops, fmt.Q4_1)
    check_prefill(ops, smollm2_dir, (16, 43))


def test_decoding_batches_stay_on_the_vector_path(ops, smollm2_dir):
    """8 sequences' prompts of 8-15 tokens, then 2 steps of 8 rows: with int8 activations every one is
    below 16 rows, so AMX on or off gives the same logits and caches bit for bit."""
    tiles_or_skip(ops, fmt.Q4_1)
    model = load_native_model(smollm2_dir, 512, ops)
    model.int8_activations = True
    results = []
    for amx in (True, False):
        ops.set_prefill_amx(amx)
        try:
            runner = ModelRunner(model, KVCache(model.args, 8, 512, torch.float32))
            for slot in range(8):
                runner.prefill(slot, [(slot * 101 + i * 13) % 3000 + 50 for i in range(8 + slot)], 0, want_logits=False)
            slots, positions, tokens = list(range(8)), [8 + s for s in range(8)], [200 + s for s in range(8)]
            steps = []
            for _ in range(2):
                logits = runner.decode(slots, tokens, positions)
                steps.append(logits)
                tokens, positions = logits.argmax(-1).tolist(), [p + 1 for p in positions]
            cache = runner.kv_cache.tensors
            results.append((steps, [cache.k[:, s, :, :positions[s]].clone() for s in slots]))
        finally:
            ops.set_prefill_amx(True)
    (steps_a, cache_a), (steps_b, cache_b) = results
    assert all(torch.equal(a, b) for a, b in zip(steps_a, steps_b))
    assert all(torch.equal(a, b) for a, b in zip(cache_a, cache_b))
