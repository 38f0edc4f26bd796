"""Int16 activations (``EngineConfig.int16_activations``, engine/r16_matmul.h): each format's R16 kernel
(the weights in 16-row interleaved groups, x as int16 blocks split into two int8 parts for VNNI) equals
its torch twin (x quantized to int16 blocks the same way, times the file's dequantized weights) on real
tensors of the packaged SmolLM2 GGUF and on synthetic blocks at 1, 3 and 8 activation rows, and the
one-call step with them agrees with the fp32-activation native path on SmolLM2."""
from __future__ import annotations

import pytest
import torch

from engine import gguf_formats as fmt
from engine.config import EngineConfig
from engine.native_weights import NativeLinear, QuantWeight, unpack_r16
from tests.engine.test_decode_gemv import random_blocks
from tests.engine.test_int8_activations import agreement_with_fp32
from tests.engine.test_native_weights import first_rows, ops, smollm2_native, smollm2_tensors  # noqa: F401 (fixtures)

QMAX = 16256  # 128 * 127


def quantize_i16_twin(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] -> the values the kernel multiplies (float64): per block of 32, s = amax / 16256 and
    Q = round(x * (1 / s)) (fp32, ties to even), i.e. s * Q."""
    blocks = x.reshape(x.shape[0], -1, 32)
    s = blocks.abs().amax(-1, keepdim=True) / QMAX
    inverse = torch.where(s != 0, 1 / s, torch.zeros_like(s))
    q = torch.round(blocks * inverse).clamp(-QMAX, QMAX)
    return (q.double() * s.double()).reshape(x.shape)


def check_i16_kernel(ops, weight: QuantWeight, batches=(1, 3, 8), mean: float = 0.0):
    """The kernel against its twin, each output against its own size (sum |x^ w|: fp32 rounding is
    relative to it), and against the fp32-activation product (int16 rounding is ~3e-5 of a block's
    largest value; int8 activations would be ~100x that)."""
    twin = weight.dequantize().double()
    grouped = weight.rows // 16 * 16  # rows after the last whole group of 16 run with fp32 activations
    g = torch.Generator().manual_seed(weight.format * 31 + weight.rows)
    bias = torch.randn(weight.rows, generator=g)
    for M in batches:
        x = torch.randn(M, weight.cols, generator=g) + mean
        xhat = quantize_i16_twin(x)
        xhat_rows = torch.cat([xhat.expand(grouped, -1, -1), x.double().expand(weight.rows - grouped, -1, -1)])
        reference = torch.einsum("nmk,nk->mn", xhat_rows, twin) + bias.double()
        size = torch.einsum("nmk,nk->mn", xhat_rows.abs(), twin.abs()) + bias.double().abs()
        got = ops.quant_linear_i16(x, weight.blocks, weight.format, weight.cols, bias).double()
        assert got.shape == (M, weight.rows)
        assert ((got - reference).abs() <= 2e-6 * size + 1e-30).all(), \
            f"{fmt.NAMES[weight.format]}, batch {M}, worst {((got - reference).abs() / size).max().item():.2e}"
        exact = x.double() @ twin.T + bias.double()
        assert ((got - exact).abs() <= 1e-4 * size + 1e-30).all(), f"batch {M}"
        # and the int16 rounding is really there (the kernel multiplies x^, not x)
        if grouped and mean == 0.0:
            assert (got[:, :grouped] - exact[:, :grouped]).abs().max() > 0


@pytest.mark.parametrize("name, format", [("blk.0.ffn_down.weight", fmt.Q4_1), ("blk.0.ffn_gate.weight", fmt.Q4_1),
                                          ("blk.3.attn_q.weight", fmt.Q4_1), ("token_embd.weight", fmt.Q8_0)])
def test_smollm2_i16_kernels(ops, smollm2_tensors, name, format):
    weight = smollm2_tensors.quant(name)
    assert weight.format == format
    check_i16_kernel(ops, first_rows(weight, rows=96))


@pytest.mark.parametrize("format", [fmt.Q4_1, fmt.Q8_0, fmt.Q4_0], ids=lambda f: fmt.NAMES[f])
@pytest.mark.parametrize("cols", [32, 576, 1536])
def test_every_value_and_tail_rows(ops, format, cols):
    """Random blocks (every nibble and byte value, fp16 scales of both signs down to subnormal, mins of
    both signs), 40 rows: two R16 groups and 8 rows after them on the fp32 path; activations around 0
    and around 1 (Q4_1's d * sum(u Q) and m * sum(x^) then cancel)."""
    g = torch.Generator().manual_seed(format * 7 + cols)
    weight = QuantWeight(format, random_blocks(format, 40, cols, g).contiguous(), cols)
    for mean in (0.0, 1.0):
        check_i16_kernel(ops, weight, batches=(1, 3, 8), mean=mean)


def test_extreme_activations(ops):
    """Blocks whose values quantize to +-16256 (q1 = +-127, q2 = 0), +-64 (q1 = +-1, q2 = -64 / 0) and
    63 (q2 = 63) against Q8_0 bytes of -128 and 127 (u = 0, 255): the largest integer sums."""
    g = torch.Generator().manual_seed(5)
    K, N = 256, 32
    q = torch.randint(-128, 128, (N, K), dtype=torch.int8, generator=g)
    q[:8] = -128
    q[8:16] = 127
    d = torch.full((N, K // 32, 1), 0.01).half().view(torch.uint8)
    blocks = torch.cat([d.reshape(N, K // 32, 2), q.view(torch.uint8).reshape(N, K // 32, 32)], -1).reshape(N, -1)
    weight = QuantWeight(fmt.Q8_0, blocks.contiguous(), K)
    x = torch.full((3, K), 1.0)
    x[1] = -1.0
    x[2] = torch.tensor([1.0, -1.0, 64 / QMAX, -64 / QMAX, 63 / QMAX, -63 / QMAX, 0.5, 0.0] * (K // 8))
    twin = weight.dequantize().double()
    reference = quantize_i16_twin(x) @ twin.T
    got = ops.quant_linear_i16(x, weight.blocks, fmt.Q8_0, K, None).double()
    assert (got - reference).abs().max().item() < 1e-5 * reference.abs().max().item()


@pytest.mark.parametrize("bits", [16, 12])
def test_quantization_by_rows_and_columns_equals_block_by_block(ops, bits):
    """x's int16 blocks as the step makes them, 16 blocks at a time (quantize_rows: 16 blocks of a row;
    quantize_column: one block of 16 rows, as gate/up's tasks) are bit-equal to one block at a time (the
    same fp32 divisions and roundings per block), whose Q = 128 q1 + q2 and scales are the torch twin's:
    zero blocks, blocks of one value, ties, huge and tiny values, 1-40 rows, 1-48 blocks a row. The same
    for the 12-bit blocks of the AMX tiles' prompt rows (bits 12, r16_matmul.h): s = amax / 2047, Q =
    16 q1 + q2 with q2 in [0, 15]."""
    qmax, shift = (QMAX, 7) if bits == 16 else (2047, 4)
    g = torch.Generator().manual_seed(11)
    for M, K in ((1, 32), (3, 96), (4, 576), (8, 576), (15, 128), (16, 512), (17, 544), (39, 576), (40, 1536)):
        x = torch.randn(M, K, generator=g) * torch.exp(3 * torch.randn(M, K // 32, 1, generator=g)).repeat_interleave(32, 1).reshape(M, K)
        x.view(M, -1, 32)[:, ::5] = 0.0  # zero blocks
        x.view(M, -1, 32)[:, 1::7] = 2.5  # one value (amax = every value: Q = qmax)
        x.view(M, -1, 32)[:, 3::7] = -2.5
        x.view(M, -1, 32)[:, 2::9, :4] = torch.tensor([0.5, -0.5, 1.5, -1.5]) * 2.5 / qmax  # ties at x / s
        x.view(M, -1, 32)[:, 2::9, 4] = 2.5
        one = ops.quantize_i16(x, 0, bits)
        if bits == 12:
            assert one[1].min() >= 0 and one[1].max() <= 15
        q = one[0].to(torch.int32) * (1 << shift) + one[1].to(torch.int32)
        s = x.view(M, -1, 32).abs().amax(-1) / qmax
        assert torch.equal(one[2], s)
        inverse = torch.where(s != 0, 1 / s, torch.zeros_like(s))
        assert torch.equal(q, torch.round(x.view(M, -1, 32) * inverse[..., None]).clamp(-qmax, qmax).to(torch.int32).view(M, K))
        assert torch.equal(one[4], q.view(M, -1, 32).sum(-1))
        assert torch.equal(one[3], s * one[4].float())
        for how in (1, 2):
            got = ops.quantize_i16(x, how, bits)
            for a, b in zip(got, one):
                assert torch.equal(a, b), (M, K, how)


@pytest.mark.parametrize("format", [fmt.Q4_1, fmt.Q8_0, fmt.Q4_0], ids=lambda f: fmt.NAMES[f])
def test_r16_layout_round_trip(ops, format):
    """The kernels' in-place packing (quant_r16_pack_) and the readable torch unpacking (unpack_r16)
    are inverse, byte for byte; a packed weight dequantizes and multiplies (per-op path) as before."""
    g = torch.Generator().manual_seed(format)
    blocks = random_blocks(format, 48, 576, g).contiguous()
    weight = QuantWeight(format, blocks.clone(), 576)
    x = torch.randn(3, 576, generator=g)
    before = ops.quant_linear(x, blocks, format, 576, None, None)
    assert ops.quant_r16_pack_(weight.blocks, format, 576).data_ptr() == weight.blocks.data_ptr()
    weight.r16 = True
    assert not torch.equal(weight.blocks, blocks)
    assert torch.equal(unpack_r16(weight.blocks, format, 576), blocks)
    assert torch.equal(weight.dequantize(), fmt.dequantize(blocks, format, 576))
    linear = NativeLinear([weight], None, ops)
    assert torch.equal(linear(x), before)


def test_refuses_formats_without_the_layout(ops):
    with pytest.raises(RuntimeError, match="no int16-activation"):
        ops.quant_linear_i16(torch.zeros(1, 256), torch.zeros(4, 144, dtype=torch.uint8), fmt.Q4_K, 256, None)


def test_config():
    assert EngineConfig(quant="native", int16_activations=True).int16_activations
    with pytest.raises(ValueError, match="int16_activations: needs quant 'native'"):
        EngineConfig(quant="int8", int16_activations=True)
    for other in ("int8_activations", "bf16_activations"):
        with pytest.raises(ValueError, match="int16_activations: not with"):
            EngineConfig(quant="native", int16_activations=True, **{other: True})


def test_decode_step_uses_int16_and_stays_close(ops, smollm2_native):
    """One-call decode steps (batch 1 and 3) with the flag against fp32 activations on the same cache:
    logits close (~1e-3 of their range) but not equal (the int16 path ran). A prompt chunk of more than
    8 rows writes the same k/v (bit-equal: its layers keep the fp32 path, on rows unpacked from R16);
    its one logit row goes through the int16 head (close, not equal). Then the
    packed model without the flag: every step bit-equal to the unpacked model's (the embedding and
    every matrix read back from R16). With AMX off: where it runs, prompt chunks with the flag take
    R16's int16 tiles (engine/r16_tiles.h; tests/engine/test_r16_tiles.py)."""
    ops.set_prefill_amx(False)
    try:
        _decode_step_uses_int16_and_stays_close(smollm2_native)
    finally:
        ops.set_prefill_amx(True)


def _decode_step_uses_int16_and_stays_close(smollm2_native):
    from engine.kv_cache import KVCache
    from engine.native_step import build_decoder

    model = smollm2_native
    prompt = torch.arange(100, 140, dtype=torch.long)
    logits, prompt_kv = {}, {}
    for flag in (False, True, "packed"):
        model.int16_activations = flag is True
        cache = KVCache(model.args, 3, 64, torch.float32)
        decoder = build_decoder(model, cache.tensors)
        assert decoder.int16_activations() == (flag is True)
        if flag:
            assert decoder.r16_bytes() > 90e6  # every layer matrix and the head (SmolLM2: ~96 MB)
        else:
            assert decoder.r16_bytes() == 0
        rows = []
        for slot in range(3):
            pre = decoder.step(prompt + slot, torch.arange(40), torch.full((40,), slot), torch.tensor([39]))
            rows.append(pre)
        prompt_kv[flag] = (cache.tensors.k[:, :3, :, :40].clone(), cache.tensors.v[:, :3, :, :40].clone())
        one = decoder.step(torch.tensor([7]), torch.tensor([40]), torch.tensor([0]), torch.tensor([0]))
        three = decoder.step(torch.tensor([7, 8, 9]), torch.tensor([41, 40, 40]), torch.tensor([0, 1, 2]),
                             torch.tensor([0, 1, 2]))
        logits[flag] = (torch.cat(rows), one, three)
    model.int16_activations = False
    for a, b in zip(prompt_kv[False] + prompt_kv["packed"], prompt_kv[True] * 2):
        assert torch.equal(a, b)  # prompt chunks' layers: fp32 activations either way
    for a, b in zip(logits[False], logits["packed"]):
        assert torch.equal(a, b)
    for a, b in zip(logits[False], logits[True]):
        diff = (a - b).abs().max().item()
        assert 0 < diff < 2e-3 * a.abs().max().item(), diff


def test_model_path_agrees_with_fp32_activations(ops, smollm2_dir, smollm2_native):
    """Greedy continuations of the fp32-activation native model scored by the same weights with int16
    activations through the one-call step (prefill, then decode steps): the quality report's figures,
    bounded tightly (measured here: top-1 1.000, mean KL 1.3e-7; int8 activations give 0.93-0.96 and
    ~3e-3)."""
    report = agreement_with_fp32(ops, smollm2_dir, "int16_activations", smollm2_native)
    assert report.top1_agreement >= 0.98, report
    assert 0 < report.mean_kl < 1e-5, report


def test_portable_fallback_matches_vnni(tmp_path):
    """engine/r16_matmul.h without AVX-512 VNNI (its scalar quantization, products and unpacking, as on
    a machine without them) against this machine's build: the same int8 parts, integer sums and packed
    bytes, and products within fp32 rounding (a small C++ harness, tests/engine/r16_portable_check.cpp,
    compiled twice)."""
    import shutil
    import subprocess
    from pathlib import Path

    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no g++")
    here = Path(__file__).parent
    outputs = {}
    for name, arch in (("native", "-march=native"), ("portable", "-march=x86-64-v3")):
        exe = tmp_path / name
        subprocess.run([compiler, "-std=c++20", "-O2", arch, f"-I{here.parent.parent / 'engine'}",
                        str(here / "r16_portable_check.cpp"), "-o", str(exe)], check=True)
        outputs[name] = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")
    native, portable = outputs["native"], outputs["portable"]
    assert len(native) == len(portable) > 40000
    for a, b in zip(native, portable):
        kind = a.split(" ")[0]
        if kind == "y":  # products: fp32 sums in another order
            x, y = float(a.split()[1]), float(b.split()[1])
            assert abs(x - y) <= 1e-5 * max(abs(x), 1e-3), (a, b)
        else:  # q1/q2 bytes, scales and sums, round trips (1 = bytes equal)
            assert a == b, (a, b)
            if kind in ("roundtrip", "partial", "inplace"):
                assert a.endswith(" 1"), a


def test_two_threads_give_the_same_step(ops, smollm2_native):
    """The int16 step on two threads (tasks split differently, each quantizing its own slices) equals
    the one-thread step bit for bit: every 16-row group and 32-value block is computed the same way
    whichever task runs it."""
    from tests.engine.test_decode_handoffs import on_one_and_two_threads

    def steps(decoder, cache):
        for slot in range(3):
            decoder.step(torch.arange(100, 112) + slot, torch.arange(12), torch.full((12,), slot), torch.tensor([11]))
        one = decoder.step(torch.tensor([7]), torch.tensor([12]), torch.tensor([0]), torch.tensor([0]))
        three = decoder.step(torch.tensor([7, 8, 9]), torch.tensor([13, 12, 12]), torch.tensor([0, 1, 2]),
                             torch.tensor([0, 1, 2]))
        k, v = cache.tensors.k, cache.tensors.v  # the positions written (the rest is torch.empty's)
        return one, three, k[:, :3, :, :13].clone(), v[:, :3, :, :13].clone(), k[:, 0, :, 13].clone()

    out = on_one_and_two_threads(smollm2_native, True, 3, steps)
    for a, b in zip(out[1], out[2]):
        assert torch.equal(a, b)
