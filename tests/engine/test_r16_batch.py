"""AMX int8 tiles for decoding batches on R16 with int16 activations (engine/r16_batch.h): q1 and q2 of
the 1-8 rows stacked in one A tile, one product per block. The kernel equals the VNNI kernel bit for bit
(the same integer sums and fp32 steps in the same order) and its torch twin within float tolerance, on
SmolLM2's Q4_1 / Q8_0 tensors and random Q4_0 / Q4_1 / Q8_0 blocks at 1, 3 and 8 rows; the one-call
step runs a decoding batch of 8 in it, with logits and k/v bit-equal to the VNNI kernel's, and a batch
of 3 on the VNNI kernel (kBatchTileMinRows). Skipped only where the CPU has no AMX-INT8; where it has
it, tiles that do not run fail."""
from __future__ import annotations

import pytest
import torch

from engine import gguf_formats as fmt
from engine.native_weights import QuantWeight
from tests.engine.test_decode_gemv import random_blocks
from tests.engine.test_int16_activations import quantize_i16_twin
from tests.engine.test_native_weights import first_rows, ops, smollm2_native, smollm2_tensors  # noqa: F401 (fixtures)
from tests.engine.test_q8_tiles import _cpu_has_amx_int8
from tests.engine.test_r16_tiles import SMOLLM2_R16_MATRICES

ROWS = (1, 3, 8)


@pytest.fixture
def batch_tiles(ops):
    if not _cpu_has_amx_int8():
        pytest.skip("this CPU has no AMX-INT8 (no amx_int8 in /proc/cpuinfo): decoding batches keep the VNNI kernel")
    assert ops.set_prefill_amx(True), "amx_int8 in /proc/cpuinfo but the tiles do not run (OS refused their state?)"
    assert ops.set_r16_batch_tiles(True), "kernels built without the batch tiles on an AMX-INT8 machine"
    yield ops
    ops.set_r16_batch_tiles(True)
    ops.set_prefill_amx(True)


def check_batch_tiles(ops, weight: QuantWeight, mean: float = 0.0):
    """The batch tiles (quant_linear_r16, tiles=2) bit-equal to the VNNI kernel (tiles=0) on the same R16
    bytes, and within 2e-6 of each output's own size (sum |x^ w|) of the twin; the kernel's call count
    grows, and does not with the batch tiles turned off."""
    twin = weight.dequantize().double()
    packed = weight.blocks.clone()
    ops.quant_r16_pack_(packed, weight.format, weight.cols)
    g = torch.Generator().manual_seed(weight.format * 17 + weight.rows + weight.cols)
    for M in ROWS:
        x = torch.randn(M, weight.cols, generator=g) + mean
        before = ops.r16_batch_tile_calls()
        got = ops.quant_linear_r16(x, packed, weight.format, weight.cols, 2)
        assert ops.r16_batch_tile_calls() > before, "the batch tiles did not run"
        vnni = ops.quant_linear_r16(x, packed, weight.format, weight.cols, 0)
        assert torch.equal(got, vnni), f"{fmt.NAMES[weight.format]}, {M} rows: {(got - vnni).abs().max().item():.3g}"
        xhat = quantize_i16_twin(x)
        reference, size = xhat @ twin.T, xhat.abs() @ twin.abs().T
        worst = ((got.double() - reference).abs() / (size + 1e-30)).max().item()
        assert ((got.double() - reference).abs() <= 2e-6 * size + 1e-30).all(), f"{M} rows: {worst:.2e}"
    ops.set_r16_batch_tiles(False)
    try:
        with pytest.raises(RuntimeError, match="batch tiles"):
            ops.quant_linear_r16(torch.randn(8, weight.cols), packed, weight.format, weight.cols, 2)
    finally:
        ops.set_r16_batch_tiles(True)


@pytest.mark.parametrize("name, format, rows", SMOLLM2_R16_MATRICES)
def test_smollm2_batch_tiles(batch_tiles, smollm2_tensors, name, format, rows):
    weight = smollm2_tensors.quant(name)
    assert weight.format == format
    check_batch_tiles(batch_tiles, first_rows(weight, rows=rows))


@pytest.mark.parametrize("format", [fmt.Q4_0, fmt.Q4_1, fmt.Q8_0], ids=lambda f: fmt.NAMES[f])
@pytest.mark.parametrize("cols", [32, 64, 608])
def test_random_blocks(batch_tiles, format, cols):
    """Every nibble / byte value and fp16 scales of both signs, 48 rows (3 groups: the Q4 B tiles split
    ahead across groups), 1, 2 or 19 blocks (no pair for the two banks, one pair, an odd count);
    activations around 0 and around 1."""
    g = torch.Generator().manual_seed(format * 7 + cols)
    weight = QuantWeight(format, random_blocks(format, 48, cols, g).contiguous(), cols)
    for mean in (0.0, 1.0):
        check_batch_tiles(batch_tiles, weight, mean)


def test_step_decode_batch_in_batch_tiles(batch_tiles, smollm2_native):
    """The one-call step with int16 activations: a decoding batch of 8 runs in the batch tiles (calls
    grow; with them off they do not) with logits and k/v bit-equal to the VNNI kernel's; a batch of 3
    keeps the VNNI kernel (no call: kBatchTileMinRows is 8)."""
    from engine.kv_cache import KVCache
    from engine.native_step import build_decoder

    ops = batch_tiles
    model = smollm2_native
    prompt = torch.arange(200, 243, dtype=torch.long)
    out = {}
    model.int16_activations = True
    try:
        for arm in ("tiles", "vnni"):
            ops.set_r16_batch_tiles(arm == "tiles")
            cache = KVCache(model.args, 8, 64, torch.float32)
            cache.tensors.k.zero_(), cache.tensors.v.zero_()  # positions never written compare equal (not reused memory)
            decoder = build_decoder(model, cache.tensors)
            for s in range(8):  # 8 sequences of 9 + s tokens
                n = 9 + s
                decoder.step(prompt[s:s + n], torch.arange(n), torch.full((n,), s), torch.tensor([n - 1]))
            positions = torch.tensor([9 + s for s in range(8)])
            before = ops.r16_batch_tile_calls()
            batch = decoder.step(torch.arange(300, 308), positions, torch.arange(8), torch.arange(8))
            calls8 = ops.r16_batch_tile_calls() - before
            second = decoder.step(batch.argmax(-1), positions + 1, torch.arange(8), torch.arange(8))
            before = ops.r16_batch_tile_calls()
            three = decoder.step(torch.tensor([5, 6, 7]), positions[:3] + 2, torch.arange(3), torch.arange(3))
            calls3 = ops.r16_batch_tile_calls() - before
            kv = (cache.tensors.k[:, :8, :, :20].clone(), cache.tensors.v[:, :8, :, :20].clone())
            out[arm] = (batch, second, three, kv, calls8, calls3)
    finally:
        model.int16_activations = False
        ops.set_r16_batch_tiles(True)
    tiles, vnni = out["tiles"], out["vnni"]
    # every layer's qkv, o, gate/up and down and the head, in each of their tasks
    assert tiles[4] >= 4 * model.args.num_layers + 1, tiles[4]
    assert vnni[4] == 0 and tiles[5] == 0 and vnni[5] == 0
    for a, b in zip(tiles[:3], vnni[:3]):
        assert torch.equal(a, b), (a - b).abs().max().item()
    for a, b in zip(tiles[3], vnni[3]):
        assert torch.equal(a, b)


def test_batch_tiles_after_other_tile_configurations(batch_tiles):
    """The batch tiles load their tile configuration only when the thread's is another (r16_tiles.h's
    load_config): calls of 8, 3 and 8 rows again, with the prompt tiles between (on int16 rows: their
    16-row configuration and its release; on 12-bit rows: the one-product configuration of 17 rows, kept
    after the call), each bit-equal to the VNNI kernel. A check that skipped a needed load would run a
    product with another call's tile shapes."""
    ops = batch_tiles
    format, cols = fmt.Q4_1, 576
    g = torch.Generator().manual_seed(11)
    packed = random_blocks(format, 64, cols, g).contiguous()
    ops.quant_r16_pack_(packed, format, cols)
    before = ops.r16_batch_tile_calls()
    for M, prompt_between in [(8, 0), (8, 0), (3, 0), (8, 0), (8, 16), (3, 16), (1, 0), (8, 12), (3, 12), (8, 0)]:
        if prompt_between == 16:
            x16 = torch.randn(16, cols, generator=g)
            prompt = ops.quant_linear_r16(x16, packed, format, cols, 3)  # the prompt tiles (on int16: bit-equal to VNNI): 16 rows
            assert torch.equal(prompt, ops.quant_linear_r16(x16, packed, format, cols, 0))
        elif prompt_between == 12:
            calls12 = ops.r16_tile_calls(12)
            ops.quant_linear_r16(torch.randn(17, cols, generator=g), packed, format, cols, 1)  # 12-bit rows: 16 + 1
            assert ops.r16_tile_calls(12) > calls12
        x = torch.randn(M, cols, generator=g)
        got = ops.quant_linear_r16(x, packed, format, cols, 2)
        assert torch.equal(got, ops.quant_linear_r16(x, packed, format, cols, 0)), f"{M} rows"
    assert ops.r16_batch_tile_calls() - before >= 8  # each call ran in them (the op may split its rows)
