"""AMX int8 tiles reading R16 with int16 activations (engine/r16_tiles.h): the tile kernel equals its
torch twin (x quantized to int16 blocks as the kernel does, times the file's dequantized weights in
float64) on SmolLM2's Q4_1 / Q8_0 tensors and random Q4_0 / Q4_1 / Q8_0 blocks, and the one-call step
runs a prompt chunk's R16 matrices in them (with int16 activations) and stays at the fp32-activation
path's output. Skipped only where the CPU has no AMX-INT8; where it has it, tiles that do not run fail."""
from __future__ import annotations

import pytest
import torch

from engine import gguf_formats as fmt
from engine.native_weights import QuantWeight
from tests.engine.test_decode_gemv import random_blocks
from tests.engine.test_int16_activations import quantize_i16_twin
from tests.engine.test_native_weights import first_rows, ops, smollm2_native, smollm2_tensors  # noqa: F401 (fixtures)
from tests.engine.test_q8_tiles import _cpu_has_amx_int8

ROWS = (2, 8, 16, 43, 300)


@pytest.fixture
def tiles(ops):
    if not _cpu_has_amx_int8():
        pytest.skip("this CPU has no AMX-INT8 (no amx_int8 in /proc/cpuinfo): int16 activations keep the VNNI kernel")
    assert ops.set_prefill_amx(True), "amx_int8 in /proc/cpuinfo but the tiles do not run (OS refused their state?)"
    assert ops.r16_tile_calls() >= 0, "kernels built without the R16 tiles on an AMX-INT8 machine"
    yield ops
    ops.set_prefill_amx(True)


def check_tiles(ops, weight: QuantWeight, mean: float = 0.0):
    """Tiles (quant_linear_r16, tiles=1) against the twin, each output within 2e-6 of its own size
    (sum |x^ w|), and against the VNNI kernel on the same R16 bytes (the same integer sums and fp32
    steps: measured bit-equal; bounded at 1e-6 of the size). The tile kernel's call count must grow."""
    twin = weight.dequantize().double()
    packed = weight.blocks.clone()
    ops.quant_r16_pack_(packed, weight.format, weight.cols)
    g = torch.Generator().manual_seed(weight.format * 13 + weight.rows)
    for M in ROWS:
        x = torch.randn(M, weight.cols, generator=g) + mean
        xhat = quantize_i16_twin(x)
        reference = xhat @ twin.T
        size = xhat.abs() @ twin.abs().T
        before = ops.r16_tile_calls()
        got = ops.quant_linear_r16(x, packed, weight.format, weight.cols, 1).double()
        assert ops.r16_tile_calls() > before, "the tiles did not run"
        assert got.shape == (M, weight.rows)
        worst = ((got - reference).abs() / (size + 1e-30)).max().item()
        assert ((got - reference).abs() <= 2e-6 * size + 1e-30).all(), f"{fmt.NAMES[weight.format]}, {M} rows: {worst:.2e}"
        vnni = ops.quant_linear_r16(x, packed, weight.format, weight.cols, 0).double()
        assert ((got - vnni).abs() <= 1e-6 * size + 1e-30).all(), f"{M} rows"
        # and the step's choice (-1): tiles from kTileMinRows (9) rows, the VNNI kernel below
        before = ops.r16_tile_calls()
        auto = ops.quant_linear_r16(x, packed, weight.format, weight.cols, -1)
        assert (ops.r16_tile_calls() > before) == (M >= 9)
        assert torch.allclose(auto.double(), got, rtol=0, atol=1e-6 * size.max().item())


# SmolLM2's R16 formats, a few groups of each: gate (3072 rows, Q4_1), down (K = 1536) and the embedding
# (Q8_0), as (tensor, format, rows of it tested)
SMOLLM2_R16_MATRICES = [("blk.0.ffn_gate.weight", fmt.Q4_1, 3072 // 16), ("blk.0.ffn_down.weight", fmt.Q4_1, 576),
                        ("token_embd.weight", fmt.Q8_0, 160)]


@pytest.mark.parametrize("name, format, rows", SMOLLM2_R16_MATRICES)
def test_smollm2_tiles(tiles, smollm2_tensors, name, format, rows):
    weight = smollm2_tensors.quant(name)
    assert weight.format == format
    check_tiles(tiles, first_rows(weight, rows=rows))


@pytest.mark.parametrize("format", [fmt.Q4_0, fmt.Q4_1, fmt.Q8_0], ids=lambda f: fmt.NAMES[f])
@pytest.mark.parametrize("cols", [32, 608])
def test_random_blocks(tiles, format, cols):
    """Every nibble / byte value and fp16 scales of both signs, 48 rows (3 groups), 1 block (no pair
    of blocks for the two C-tile banks) or 19 (an odd count); activations around 0 and around 1."""
    g = torch.Generator().manual_seed(format * 5 + cols)
    weight = QuantWeight(format, random_blocks(format, 48, cols, g).contiguous(), cols)
    for mean in (0.0, 1.0):
        check_tiles(tiles, weight, mean)


@pytest.mark.parametrize("format", [fmt.Q4_0, fmt.Q4_1, fmt.Q8_0], ids=lambda f: fmt.NAMES[f])
def test_every_row_count_equals_vnni(tiles, format):
    """The tile kernel runs each block of up to 16 activation rows in code compiled for its row count
    (1-16: the accumulators in registers); every count's outputs are bit-equal to the VNNI kernel's on
    the same R16 bytes (the same integer sums and fp32 steps in the same order), alone (M = 1-16) and as
    the last block after full ones (M = 17-32), over 19 blocks (an odd count: the last block after the
    loop's pairs) and 2 blocks (one pair: one per bank of A and B tiles)."""
    g = torch.Generator().manual_seed(format * 7 + 1)
    for cols in (608, 64):
        weight = QuantWeight(format, random_blocks(format, 32, cols, g).contiguous(), cols)
        packed = weight.blocks.clone()
        tiles.quant_r16_pack_(packed, weight.format, weight.cols)
        x = torch.randn(32, cols, generator=g) + 0.5
        for M in range(1, 33):
            before = tiles.r16_tile_calls()
            got = tiles.quant_linear_r16(x[:M].contiguous(), packed, format, cols, 1)
            assert tiles.r16_tile_calls() > before
            vnni = tiles.quant_linear_r16(x[:M].contiguous(), packed, format, cols, 0)
            assert torch.equal(got, vnni), f"{fmt.NAMES[format]}, K {cols}, {M} rows: {(got - vnni).abs().max().item():.3e}"


def test_step_prompt_in_tiles(tiles, smollm2_native):
    """The one-call step, int16 activations on: a 43-token prompt chunk runs its R16 matrices in the
    tiles, and its k/v and logits stay at the fp32-activation step's (every row's argmax, within 2e-3
    of the logits' range) and near the untiled int16 step's (AMX off: rows unpacked for fp32) without
    equalling it; a decode batch of 8 keeps the VNNI kernel (no tile call) and stays at fp32's."""
    from engine.kv_cache import KVCache
    from engine.native_step import build_decoder

    ops = tiles
    model = smollm2_native
    prompt = torch.arange(200, 243, dtype=torch.long)
    out = {}
    for arm, int16, amx in (("fp32", False, True), ("tiles", True, True), ("untiled", True, False)):
        model.int16_activations = int16
        ops.set_prefill_amx(amx)
        try:
            cache = KVCache(model.args, 9, 64, torch.float32)
            decoder = build_decoder(model, cache.tensors)
            before = ops.r16_tile_calls()
            logits = decoder.step(prompt, torch.arange(43), torch.zeros(43, dtype=torch.long), torch.arange(43))
            calls = ops.r16_tile_calls() - before
            for s in range(1, 9):  # 8 more sequences of 9 tokens for the decode batch
                decoder.step(prompt[s:s + 9], torch.arange(9), torch.full((9,), s), torch.tensor([8]))
            kv = (cache.tensors.k[:, 0, :, :43].clone(), cache.tensors.v[:, 0, :, :43].clone())
            before = ops.r16_tile_calls()
            batch = decoder.step(torch.arange(300, 308), torch.tensor([43] + [9] * 7),
                                 torch.tensor([0, 2, 3, 4, 5, 6, 7, 8]), torch.arange(8))
            batch_calls = ops.r16_tile_calls() - before
        finally:
            model.int16_activations = False
            ops.set_prefill_amx(True)
        out[arm] = (logits, kv, batch, calls, batch_calls)
    # tiles ran in the prompt (every layer's qkv, o, gate/up, down and the head), never in the batch
    assert out["tiles"][3] >= 4 * model.args.num_layers, out["tiles"][3]
    assert out["untiled"][3] == 0 and out["fp32"][3] == 0
    assert out["tiles"][4] == 0 and out["untiled"][4] == 0
    fp32 = out["fp32"]
    for arm in ("tiles", "untiled"):
        logits, kv, batch = out[arm][:3]
        for a, b in ((logits, fp32[0]), (batch, fp32[2])):
            assert (a - b).abs().max().item() < 2e-3 * b.abs().max().item()
            assert torch.equal(a.argmax(-1), b.argmax(-1))
        for a, b in zip(kv, fp32[1]):
            assert (a - b).abs().max().item() < 2e-3 * b.abs().max().item()
    tiles_, untiled = out["tiles"], out["untiled"]
    assert not torch.equal(tiles_[0], untiled[0])  # the prompt's layers: int16 in tiles vs fp32
    for a, b in zip(tiles_[1], untiled[1]):
        assert 0 < (a - b).abs().max().item() < 2e-3 * b.abs().max().item()
    assert (tiles_[0] - untiled[0]).abs().max().item() < 2e-3 * untiled[0].abs().max().item()
