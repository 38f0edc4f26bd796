"""Int8 activations (``EngineConfig.int8_activations``, engine/q8_matmul.h): each GGUF block format's
integer kernel equals its torch twin (activations quantized to Q8 blocks the same way, then the
file's dequantized weights) on real tensors of the packaged files at batch 1, 3 and 8, and the
model's one-call step with them agrees with the fp32-activation native path on SmolLM2."""
from __future__ import annotations

import pytest
import torch

from bench.quality import QUALITY_PROMPTS, compare
from engine import gguf_formats as fmt
from engine.config import EngineConfig
from engine.native_weights import QuantWeight, load_native_model
from tests.engine.test_native_weights import first_rows, ops, qwen_tensors, smollm2_tensors  # noqa: F401 (fixtures)


def quantize_q8_twin(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] -> the values the kernel multiplies: per block of 32, d = amax / 127 and
    q = round(x * (1 / d)) (ties to even, fp32), i.e. q * d."""
    blocks = x.reshape(x.shape[0], -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    inverse = torch.where(d != 0, 1 / d, torch.zeros_like(d))
    return (torch.round(blocks * inverse) * d).reshape(x.shape)


def check_q8_kernel(ops, weight: QuantWeight, batches=(1, 3, 8)):
    twin = weight.dequantize().double()
    g = torch.Generator().manual_seed(weight.format)
    bias = torch.randn(weight.rows, generator=g)
    for M in batches:
        x = torch.randn(M, weight.cols, generator=g)
        reference = quantize_q8_twin(x).double() @ twin.T + bias.double()
        got = ops.quant_linear_q8(x, weight.blocks, weight.format, weight.cols, bias)
        assert got.shape == (M, weight.rows)
        scale = reference.abs().max().item()
        assert (got.double() - reference).abs().max().item() < 2e-6 * scale * weight.cols ** 0.5, f"batch {M}"
        # and it is an approximation of the fp32-activation product, not something else
        exact = x.double() @ twin.T + bias.double()
        assert (got.double() - exact).abs().max().item() < 0.05 * exact.abs().max().item(), f"batch {M}"


@pytest.mark.parametrize("name, format", [("blk.0.ffn_down.weight", fmt.Q4_1), ("token_embd.weight", fmt.Q8_0)])
def test_smollm2_q8_kernels(ops, smollm2_tensors, name, format):
    weight = smollm2_tensors.quant(name)
    assert weight.format == format
    check_q8_kernel(ops, first_rows(weight))


@pytest.mark.parametrize("format", [fmt.Q5_0, fmt.Q8_0, fmt.Q4_K, fmt.Q6_K])
def test_qwen_q8_kernels(ops, qwen_tensors, format):
    name = next(n for n, t in qwen_tensors.tensors.items() if t.ggml_type == format and len(t.shape) == 2)
    check_q8_kernel(ops, first_rows(qwen_tensors.quant(name)))


@pytest.mark.parametrize("name", ["blk.0.ffn_gate.weight", "blk.0.attn_v.weight", "blk.0.ffn_down.weight",
                                  "blk.2.ffn_down.weight", "output.weight"])
def test_qwen_q8_kernels_grouped_and_tails(ops, qwen_tensors, name):
    """The kernels sum 8 sub-blocks' integer dots before scaling them (a K-quant block, or 8 blocks of
    Q5_0 / Q8_0; the rest of a row block by block): rows of 896 values are 3 groups of 8 blocks and a
    tail of 4, 99 rows end with rows one by one, and every register tiling of 1-8 activation rows runs."""
    weight = first_rows(qwen_tensors.quant(name), rows=99)
    check_q8_kernel(ops, weight, batches=(1, 2, 4, 5, 8))


# Where each format's fp16 fields sit in its block (bytes), and the block's size.
FP16_FIELDS = {fmt.Q8_0: ((0, 2), 34), fmt.Q4_0: ((0,), 18), fmt.Q4_1: ((0, 2), 20), fmt.Q5_0: ((0,), 22),
               fmt.Q4_K: ((0, 2), 144), fmt.Q6_K: ((208,), 210)}


@pytest.mark.parametrize("format", list(FP16_FIELDS), ids=lambda f: fmt.NAMES[f])
def test_every_byte_value(ops, format):
    """Blocks of random bytes (every quant value and scale a format can store: Q8_0's -128, Q6_K's 63
    and -128 scales, Q5_0's 31, Q4_K's 63 scales and mins) times activations that quantize to -127 and
    127: the largest byte products the integer paths see (VNNI reads Q8_0 as q + 128 up to 255;
    Q6_K's pairs are formed before its 16-bit scales). A product that saturated an int16 pair or
    wrapped a byte would be off by thousands; these equal the exact product of the file's values."""
    fields, size = FP16_FIELDS[format]
    qk = fmt.GEOMETRY[format][0]
    g = torch.Generator().manual_seed(format)
    K, N = (2048 if qk == 256 else 59 * 32), 24  # 32-weight formats: 7 groups of 8 blocks and a tail of 3
    blocks = torch.randint(0, 256, (N, K // qk, size), generator=g, dtype=torch.uint8)
    for at in fields:  # finite scales: +-0.5 (Q4_1's m and Q4_K's dmin too)
        sign = torch.where(torch.rand(N, K // qk, generator=g) < 0.5, -0.5, 0.5)
        blocks[:, :, at: at + 2] = sign.to(torch.float16).view(torch.uint8).reshape(N, K // qk, 2)
    weight = QuantWeight(format, blocks.reshape(N, -1).contiguous(), K)
    x = torch.where(torch.rand(3, K, generator=g) < 0.5, -1.0, 1.0)
    x[1] = 1.0
    exact = x.double() @ weight.dequantize().double().T  # +-1 quantize exactly: d = 1 / 127, q = +-127
    got = ops.quant_linear_q8(x, weight.blocks, format, K, None)
    assert (got.double() - exact).abs().max().item() < 1e-5 * exact.abs().max().item()
    check_q8_kernel(ops, weight)


def test_q8_kernel_refuses_formats_without_an_integer_path(ops):
    with pytest.raises(RuntimeError, match="no int8-activation path"):
        ops.quant_linear_q8(torch.zeros(1, 32), torch.zeros(4, 128, dtype=torch.uint8), fmt.F32, 32, None)


def test_config_needs_native_weights():
    with pytest.raises(ValueError, match="int8_activations: needs quant 'native'"):
        EngineConfig(quant="int8", int8_activations=True)


def agreement_with_fp32(ops, smollm2_dir, flag: str, reference=None):
    """The quality report's comparison on SmolLM2 (3 prompts x 32 greedy tokens): the fp32-activation
    native model (``reference``, or a new one) against one with the model attribute ``flag`` set, through
    the one-call step (prefill and decode)."""
    from engine.loader import chat_prompt_ids, load_tokenizer

    reference = reference or load_native_model(smollm2_dir, 256, ops)
    candidate = load_native_model(smollm2_dir, 256, ops)
    setattr(candidate, flag, True)
    tokenizer = load_tokenizer(smollm2_dir)
    prompts = [chat_prompt_ids(tokenizer, [{"role": "user", "content": q}]) for q in QUALITY_PROMPTS[:3]]
    report = compare(reference, candidate, prompts, 32, {tokenizer.eos_token_id})
    print(report)
    assert report.num_positions >= 60
    return report


def test_model_path_agrees_with_fp32_activations(ops, smollm2_dir):
    """Greedy continuations of the fp32-activation native model (the reference) scored by the same
    weights with int8 activations, through the one-call step (prefill and decode): the quality
    report's figures, bounded (measured here: top-1 agreement 0.93-0.96, mean KL ~0.003; a wrong
    block or scale gives KL > 1)."""
    report = agreement_with_fp32(ops, smollm2_dir, "int8_activations")
    assert report.top1_agreement >= 0.85, report
    assert report.mean_kl < 0.02, report
