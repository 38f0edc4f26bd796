"""AMX int8 tiles reading R16 with int16 activations (engine/r16_tiles.h): on 12-bit rows (the one-call
step's prompt rows: one K = 64 product per block for Q4, two for Q8_0) the tile kernel equals its torch
twin (x quantized to 12-bit blocks as the kernel does, the integer dot exact, times the file's
dequantized weights in float64), on int16 rows (two products) the VNNI kernel bit for bit, on SmolLM2's
Q4_1 / Q8_0 tensors and random Q4_0 / Q4_1 / Q8_0 blocks; and the one-call step runs a prompt chunk's
R16 matrices in them on 12-bit rows and stays at the fp32-activation path's output. Skipped only where the
CPU has no AMX-INT8; where it has it, tiles that do not run fail."""
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
QMAX12 = 2047


def quantize_i12_twin(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] -> the values the tiles multiply on 12-bit rows (float64): per block of 32, s = amax / 2047
    and Q = round(x * (1 / s)) (fp32, ties to even) in [-2047, 2047], i.e. s * Q."""
    blocks = x.reshape(x.shape[0], -1, 32)
    s = blocks.abs().amax(-1, keepdim=True) / QMAX12
    inverse = torch.where(s != 0, 1 / s, torch.zeros_like(s))
    q = torch.round(blocks * inverse).clamp(-QMAX12, QMAX12)
    return (q.double() * s.double()).reshape(x.shape)


def tile_twin(weight: QuantWeight, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 12-bit tiles' reference for x [M, K] and its size (sum |x^ w|, what fp32 rounding is relative
    to): x^ = s Q (quantize_i12_twin) times the dequantized weights, in float64 (the integer dot is exact
    there: |sum Q u| < 2^53)."""
    xhat, twin = quantize_i12_twin(x), weight.dequantize().double()
    return xhat @ twin.T, xhat.abs() @ twin.abs().T


@pytest.fixture
def tiles(ops):
    if not _cpu_has_amx_int8():
        pytest.skip("this CPU has no AMX-INT8 (no amx_int8 in /proc/cpuinfo): int16 activations keep the VNNI kernel")
    assert ops.set_prefill_amx(True), "amx_int8 in /proc/cpuinfo but the tiles do not run (OS refused their state?)"
    assert ops.r16_tile_calls() >= 0, "kernels built without the R16 tiles on an AMX-INT8 machine"
    yield ops
    ops.set_prefill_amx(True)


def check_tiles(ops, weight: QuantWeight, mean: float = 0.0):
    """Tiles on 12-bit rows (quant_linear_r16, tiles=1) against the 12-bit twin, each output within 2e-6
    of its own size (sum |x^ w|); tiles on int16 rows (tiles=3) against the int16 twin at the same bound
    and bit-equal to the VNNI kernel on the same R16 bytes (the same integer sums and fp32 steps). The
    tile kernel's call counts must grow (the 12-bit one only with tiles=1). The step's choice (-1): the
    12-bit tiles from kTileMinRows (9) rows (bit-equal to tiles=1), the VNNI kernel on int16 rows below."""
    twin = weight.dequantize().double()
    packed = weight.blocks.clone()
    ops.quant_r16_pack_(packed, weight.format, weight.cols)
    g = torch.Generator().manual_seed(weight.format * 13 + weight.rows)
    for M in ROWS:
        x = torch.randn(M, weight.cols, generator=g) + mean
        reference, size = tile_twin(weight, x)
        before, before12 = ops.r16_tile_calls(), ops.r16_tile_calls(12)
        got = ops.quant_linear_r16(x, packed, weight.format, weight.cols, 1).double()
        assert ops.r16_tile_calls() > before and ops.r16_tile_calls(12) > before12, "the 12-bit tiles did not run"
        assert got.shape == (M, weight.rows)
        worst = ((got - reference).abs() / (size + 1e-30)).max().item()
        assert ((got - reference).abs() <= 2e-6 * size + 1e-30).all(), f"{fmt.NAMES[weight.format]}, {M} rows: {worst:.2e}"
        xhat16 = quantize_i16_twin(x)
        reference16, size16 = xhat16 @ twin.T, xhat16.abs() @ twin.abs().T
        before, before12 = ops.r16_tile_calls(), ops.r16_tile_calls(12)
        got16 = ops.quant_linear_r16(x, packed, weight.format, weight.cols, 3)
        assert ops.r16_tile_calls() > before and ops.r16_tile_calls(12) == before12
        assert ((got16.double() - reference16).abs() <= 2e-6 * size16 + 1e-30).all(), f"int16, {M} rows"
        vnni = ops.quant_linear_r16(x, packed, weight.format, weight.cols, 0)
        assert torch.equal(got16, vnni), f"{M} rows"
        before = ops.r16_tile_calls()
        auto = ops.quant_linear_r16(x, packed, weight.format, weight.cols, -1)
        assert (ops.r16_tile_calls() > before) == (M >= 9)
        assert torch.equal(auto.double(), got) if M >= 9 else torch.equal(auto, vnni)


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
@pytest.mark.parametrize("cols", [32, 608, 1568])
def test_random_blocks(tiles, format, cols):
    """Every nibble / byte value and fp16 scales of both signs, 48 rows (3 groups), 1 block (no pair
    of blocks for the two banks of tiles), 19 (an odd count) or 49 (Q4 on 12-bit rows: five spans of
    9-10 blocks split at a time, r16_tiles.h's split_spans); activations around 0 and around 1."""
    g = torch.Generator().manual_seed(format * 5 + cols)
    weight = QuantWeight(format, random_blocks(format, 48, cols, g).contiguous(), cols)
    for mean in (0.0, 1.0):
        check_tiles(tiles, weight, mean)


@pytest.mark.parametrize("format", [fmt.Q4_0, fmt.Q4_1, fmt.Q8_0], ids=lambda f: fmt.NAMES[f])
def test_every_row_count(tiles, format):
    """The tile kernel runs each block of up to 16 activation rows in code compiled for its row count
    (1-16: the accumulators in registers), alone (M = 1-16) and as the last block after one or two full ones
    (M = 17-48; on 12-bit Q4 rows in the configuration's second slot of tiles), over 19 blocks (an odd
    count: the last block after the loop's pairs), 2 blocks (one pair: one per bank of A and B tiles), 48
    (SmolLM2's down: four spans of 12 for Q4 on 12-bit rows; and row_block12 compiled for 48 blocks) and 18
    (SmolLM2's K = 576: compiled for 18). On 12-bit rows every count's outputs are within 2e-6 of their own
    size of the 12-bit twin; on int16 rows bit-equal to the VNNI kernel's on the same R16 bytes (the same
    integer sums and fp32 steps in the same order)."""
    g = torch.Generator().manual_seed(format * 7 + 1)
    for cols in (608, 64, 1536, 576):
        weight = QuantWeight(format, random_blocks(format, 32, cols, g).contiguous(), cols)
        packed = weight.blocks.clone()
        tiles.quant_r16_pack_(packed, weight.format, weight.cols)
        x = torch.randn(48, cols, generator=g) + 0.5
        for M in range(1, 49):
            xm = x[:M].contiguous()
            before = tiles.r16_tile_calls(12)
            got = tiles.quant_linear_r16(xm, packed, format, cols, 1).double()
            assert tiles.r16_tile_calls(12) > before
            reference, size = tile_twin(weight, xm)
            worst = ((got - reference).abs() / (size + 1e-30)).max().item()
            assert ((got - reference).abs() <= 2e-6 * size + 1e-30).all(), f"{fmt.NAMES[format]}, K {cols}, {M} rows: {worst:.2e}"
            if M > 32:
                continue  # the two-product kernel's row blocks: as at 17-32
            got16 = tiles.quant_linear_r16(xm, packed, format, cols, 3)
            vnni = tiles.quant_linear_r16(xm, packed, format, cols, 0)
            assert torch.equal(got16, vnni), f"{fmt.NAMES[format]}, K {cols}, {M} rows: {(got16 - vnni).abs().max().item():.3e}"


@pytest.mark.parametrize("format", [fmt.Q4_0, fmt.Q4_1], ids=lambda f: fmt.NAMES[f])
def test_rows_equal_one_at_a_time(tiles, format):
    """The one-product tiles (12-bit rows, Q4: r16_tiles.h's matmul12) give each row the same integer sums
    and fp32 steps whatever rows share its call: every row count 1-48 (the full blocks of 16 in the
    configuration's first slot of tiles, the last M % 16 rows in its second; below 16 rows the first)
    bit-equal to the same rows multiplied one at a time (one row in the first slot), at K = 576 and 1536
    (row_block12 compiled for 18 and 48 blocks, and 1536 in four spans of 12) and 608 and 64 (19 and 2
    blocks, at run time). Between the calls the thread's tile configuration is the batch tiles' (a call of
    3 rows: load_config must load the prompt tiles' again), the same call's (consecutive M: no load needed
    when equal) or another row count's. A call that ran a row against another row's activations, scales or
    blocks, another span's split weights or the wrong slot's tile shapes differs from the single rows."""
    assert tiles.set_r16_batch_tiles(True), "kernels built without the batch tiles on an AMX-INT8 machine"
    g = torch.Generator().manual_seed(format * 3 + 2)
    for cols in (576, 1536, 608, 64):
        packed = random_blocks(format, 32, cols, g).contiguous()
        tiles.quant_r16_pack_(packed, format, cols)
        x = torch.randn(48, cols, generator=g) * torch.rand(48, 1, generator=g) * 4
        single = torch.cat([tiles.quant_linear_r16(x[m:m + 1].contiguous(), packed, format, cols, 1) for m in range(48)])
        for M in range(1, 49):
            if M % 5 == 0:
                tiles.quant_linear_r16(x[:3].contiguous(), packed, format, cols, 2)  # the batch tiles' configuration
            before = tiles.r16_tile_calls(12)
            got = tiles.quant_linear_r16(x[:M].contiguous(), packed, format, cols, 1)
            assert tiles.r16_tile_calls(12) > before, "the 12-bit tiles did not run"
            assert torch.equal(got, single[:M]), f"{fmt.NAMES[format]}, K {cols}, {M} rows: rows {(got != single[:M]).any(1).nonzero().flatten().tolist()}"
            if M % 7 == 0:  # the same call again, its configuration kept
                assert torch.equal(tiles.quant_linear_r16(x[:M].contiguous(), packed, format, cols, 1), got)


def test_row_pitch12(ops):
    """12-bit rows (the tiles' prompt rows: the step's carve, quantize_i16, the ops' inputs) lie
    r16::pitch12(K) bytes apart, which puts the 16 rows of an A tile load (the same block of each: one
    64-byte line a row) in 16 different L1 sets (64 sets of 64-byte lines): 2K where that holds (K = 576:
    18 lines; Qwen's 896: 28), else one line more (SmolLM2's down, K = 1536: 48 lines, whose 16 rows sat in
    4 sets, 3136 = 49 lines; Qwen's 4864). Every K % 32 == 0 up to 8192."""
    assert [ops.r16_pitch12(K) for K in (1536, 576, 896, 4864)] == [3136, 1152, 1792, 9792]
    for K in range(32, 8193, 32):
        pitch = ops.r16_pitch12(K)
        assert pitch in (2 * K, 2 * K + 64), K
        assert len({m * pitch // 64 % 64 for m in range(16)}) == 16, K


def test_extreme_activations(tiles):
    """12-bit rows whose values quantize to +-2047 (q1 = 127 / -128, q2 = 15 / 1), +-16 (q1 = +-1, q2 = 0),
    15 (q2 = 15) and -1 (q1 = -1, q2 = 15) against Q4_0 nibbles 0 and 15 (B bytes 0 and 240) and Q8_0 bytes
    -128 and 127 (u = 0, 255): the largest integer sums, exactly (within float rounding) the twin's."""
    g = torch.Generator().manual_seed(5)
    K, N = 256, 32
    x = torch.full((4, K), 1.0)
    x[1] = -1.0
    x[2] = torch.tensor([1.0, -1.0, 16 / QMAX12, -16 / QMAX12, 15 / QMAX12, -1 / QMAX12, 0.5, 0.0] * (K // 8))
    x[3] = torch.tensor([1.0, -1.0] * (K // 2))
    x = torch.cat([x] * 3)  # 12 rows
    d = torch.full((N, K // 32, 1), 0.01).half().view(torch.uint8)
    q8 = torch.randint(-128, 128, (N, K), dtype=torch.int8, generator=g)
    q8[:8], q8[8:16] = -128, 127
    q4 = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, generator=g)
    q4[:8], q4[8:16] = 0, 255
    for format, qs in ((fmt.Q8_0, q8.view(torch.uint8).reshape(N, K // 32, 32)), (fmt.Q4_0, q4.reshape(N, K // 32, 16))):
        weight = QuantWeight(format, torch.cat([d.reshape(N, K // 32, 2), qs], -1).reshape(N, -1).contiguous(), K)
        packed = weight.blocks.clone()
        tiles.quant_r16_pack_(packed, format, K)
        reference, size = tile_twin(weight, x)
        got = tiles.quant_linear_r16(x, packed, format, K, 1).double()
        assert ((got - reference).abs() <= 2e-6 * size + 1e-30).all(), fmt.NAMES[format]


def test_step_prompt_in_tiles(tiles, smollm2_native):
    """The one-call step, int16 activations on: a 43-token prompt chunk runs its R16 matrices in the
    tiles on 12-bit rows (every call of the prompt's), and its k/v and logits (all 43 rows: the LM head's
    Q8_0 in the tiles too) stay at the fp32-activation step's (every row's argmax, within 2e-3 of the
    logits' range) and near the untiled int16 step's (AMX off: rows unpacked for fp32) without equalling
    it; a decode batch of 8 keeps the VNNI kernel (no tile call) and stays at fp32's."""
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
            before, before12 = ops.r16_tile_calls(), ops.r16_tile_calls(12)
            logits = decoder.step(prompt, torch.arange(43), torch.zeros(43, dtype=torch.long), torch.arange(43))
            calls, calls12 = ops.r16_tile_calls() - before, ops.r16_tile_calls(12) - before12
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
        out[arm] = (logits, kv, batch, calls, batch_calls, calls12)
    # tiles ran in the prompt (every layer's qkv, o, gate/up, down and the head) on 12-bit rows, never in the batch
    assert out["tiles"][3] >= 4 * model.args.num_layers, out["tiles"][3]
    assert out["tiles"][5] == out["tiles"][3]
    assert out["untiled"][3] == 0 and out["fp32"][3] == 0
    assert out["tiles"][4] == 0 and out["untiled"][4] == 0
    fp32 = out["fp32"]
    # bounds, of the range: the prompt's 12-bit rows round ~8x coarser than int16 (measured from fp32's:
    # the prompt's logits 3.0e-3, k 2.2e-3, v 3.5e-3, the batch after it 3.4e-3; with int16 rows in the
    # tiles 2.3e-4 - 6.6e-4); the untiled step (fp32 prompt, int16 batch) within 2e-3
    for arm, bound in (("tiles", 5e-3), ("untiled", 2e-3)):
        logits, kv, batch = out[arm][:3]
        for a, b in ((logits, fp32[0]), (batch, fp32[2])):
            assert (a - b).abs().max().item() < bound * b.abs().max().item()
            assert torch.equal(a.argmax(-1), b.argmax(-1))
        for a, b in zip(kv, fp32[1]):
            assert (a - b).abs().max().item() < bound * b.abs().max().item()
    tiles_, untiled = out["tiles"], out["untiled"]
    assert not torch.equal(tiles_[0], untiled[0])  # the prompt's layers: 12-bit in tiles vs fp32
    for a, b in zip(tiles_[1], untiled[1]):
        assert 0 < (a - b).abs().max().item() < 5e-3 * b.abs().max().item()
    assert (tiles_[0] - untiled[0]).abs().max().item() < 5e-3 * untiled[0].abs().max().item()
