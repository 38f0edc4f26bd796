"""bf16 activations (``EngineConfig.bf16_activations``, engine/prefill_gemm.h's AMX path): the Q4_0 /
Q5_0 / Q4_1 matmuls of 16+ rows (prompt chunks) round x to bf16 and multiply the file's weights
exactly (each d q as two bf16 parts, two tile products), so the result is bf16(x) . W with fp32 sums;
fewer rows (decoding batches, where the tiles are slower) keep fp32. Each format against its
pure-torch twin (x rounded to bf16 from 16 rows on, the dequantized weights) at 1, 3, 8, 16, 43 and
300 rows, the one-call step's prefill against the pure-torch model whose linears round their inputs
the same way, and its batch-8 decode against the fp32 step."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from engine import gguf_formats as fmt
from engine.config import EngineConfig
from engine.kv_cache import KVCache
from engine.loader import load_model
from engine.native_weights import QuantWeight, load_native_model
from engine.runner import ModelRunner
from tests.engine.test_native_weights import ops, smollm2_tensors  # noqa: F401 (fixtures)

ROWS = (1, 3, 8, 16, 43, 300)
TILE_ROWS = 16  # prefill_gemm.h's kBf16MinRows


def _tiles_or_skip(ops, format):
    if not ops.bf16_activation_tiles(format):
        pytest.skip("no AMX bf16 tiles here (or the OS refused their state): activations stay fp32")


def random_blocks(format: int, rows: int, cols: int, seed: int) -> QuantWeight:
    """Random blocks of a format with finite fp16 scales (d ~ 0.01, Q4_1's min ~ -0.1)."""
    qk, nbytes = fmt.GEOMETRY[format]
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (rows * cols // qk, nbytes), generator=g, dtype=torch.uint8)
    d = (torch.rand(blocks.shape[0], generator=g) * 0.02 + 1e-3).half()
    blocks[:, 0:2] = d.view(torch.uint8).reshape(-1, 2)
    if format == fmt.Q4_1:
        m = (-torch.rand(blocks.shape[0], generator=g) * 0.2).half()
        blocks[:, 2:4] = m.view(torch.uint8).reshape(-1, 2)
    return QuantWeight(format, blocks.reshape(rows, -1).contiguous(), cols)


def check_bf16_rows(ops, weight: QuantWeight):
    """``quant_linear_bf16x`` at each row count against bf16(x) @ W.T + bias in float64 (from 16 rows on:
    measurably not the fp32-activation product; below, that one)."""
    twin = weight.dequantize().double()
    g = torch.Generator().manual_seed(weight.format * 7 + weight.cols)
    bias = torch.randn(weight.rows, generator=g)
    for M in ROWS:
        x = torch.randn(M, weight.cols, generator=g)
        x_in = x if M < TILE_ROWS else x.bfloat16().float()
        reference = x_in.double() @ twin.T + bias.double()
        fp32 = x.double() @ twin.T + bias.double()
        got = ops.quant_linear_bf16x(x, weight.blocks, weight.format, weight.cols, None, bias).double()
        scale = reference.abs().max().item()
        error = (got - reference).abs().max().item()
        assert error < 2e-6 * scale * weight.cols ** 0.5, f"{M} rows: {error} of {scale}"
        if M >= TILE_ROWS:  # the rounding is there: the fp32 product is ~100x further off
            assert (got - fp32).abs().max().item() > 20 * error, f"{M} rows: fp32 activations?"


@pytest.mark.parametrize("name", ["blk.0.ffn_down.weight", "blk.5.ffn_up.weight", "blk.3.attn_q.weight"])
def test_q4_1_of_the_packaged_file(ops, smollm2_tensors, name):
    _tiles_or_skip(ops, fmt.Q4_1)
    weight = smollm2_tensors.quant(name)
    assert weight.format == fmt.Q4_1
    # 50 rows: three panels of 16 and one of 2 (the A tiles' zero rows)
    check_bf16_rows(ops, QuantWeight(weight.format, weight.blocks[:50].contiguous(), weight.cols))


@pytest.mark.parametrize("format", [fmt.Q4_0, fmt.Q5_0, fmt.Q4_1])
@pytest.mark.parametrize("cols", [64, 576, 1536])  # 2 (even), 18 and 48 k blocks of 32; a lone block's odd tail
def test_pair_formats_of_random_blocks(ops, format, cols):
    _tiles_or_skip(ops, format)
    check_bf16_rows(ops, random_blocks(format, 37, cols, seed=format + cols))


def test_other_formats_keep_fp32_activations(ops, smollm2_tensors):
    """Q8_0 (SmolLM2's embedding / LM head) is not exact as a bf16 pair: the same result as fp32."""
    weight = smollm2_tensors.quant("token_embd.weight")
    blocks = weight.blocks[:40].contiguous()
    assert not ops.bf16_activation_tiles(fmt.Q8_0)
    x = torch.randn(43, weight.cols, generator=torch.Generator().manual_seed(3))
    assert torch.equal(ops.quant_linear_bf16x(x, blocks, fmt.Q8_0, weight.cols, None, None),
                       ops.quant_linear(x, blocks, fmt.Q8_0, weight.cols, None, None))


def test_config():
    assert EngineConfig(quant="native", bf16_activations=True).bf16_activations
    with pytest.raises(ValueError, match="bf16_activations: needs quant 'native'"):
        EngineConfig(quant="int8", bf16_activations=True)
    with pytest.raises(ValueError, match="bf16_activations: not with int8_activations"):
        EngineConfig(quant="native", bf16_activations=True, int8_activations=True)


class Bf16Input(nn.Module):
    """The pure-torch twin of a linear with bf16 activations: its input rounded to bf16."""

    def __init__(self, linear: nn.Module):
        super().__init__()
        self.linear = linear

    def forward(self, x):
        return self.linear(x.bfloat16().float())


def bf16_twin(smollm2_dir):
    """The fp32 model of the file (its weights exact) whose Q4_1 linears take bf16 inputs; the LM head
    (Q8_0) keeps fp32 ones, as the native step does."""
    model = load_model(smollm2_dir, torch.float32, 512)
    for block in model.layers:
        block.attn.qkv, block.attn.o_proj = Bf16Input(block.attn.qkv), Bf16Input(block.attn.o_proj)
        block.mlp.gate_up, block.mlp.down_proj = Bf16Input(block.mlp.gate_up), Bf16Input(block.mlp.down_proj)
    return model


def _runner(model, slots=9):
    return ModelRunner(model, KVCache(model.args, slots, 512, torch.float32))


@pytest.fixture(scope="module")
def models(ops, smollm2_dir):
    if not ops.bf16_activation_tiles(fmt.Q4_1):
        pytest.skip("no AMX bf16 tiles here: nothing but fp32 to compare")
    native = load_native_model(smollm2_dir, 512, ops)
    native_bf16 = load_native_model(smollm2_dir, 512, ops)
    native_bf16.bf16_activations = True
    return native, native_bf16, bf16_twin(smollm2_dir)


def _mean_off(a, b):
    return (a - b).abs().mean().item()


def check_against_twin(runs, read):
    """runs: the twin's, the bf16 step's and the fp32 step's runners after the same work; read(runner) ->
    (logits, [k, v] of layer 0, of layer 1). Layer 0's k/v depend only on the tokens and one qkv product,
    so the bf16 step's equal the twin's (a rounding to bf16 flips only where fp32's summation order moved
    x across a rounding boundary), ~1000x closer than the fp32 step's; each later layer's differences
    cross more boundaries and grow (measured, 43 tokens: 2e-7, 1.4e-4, 1.4e-3 by layer 2 against the
    fp32 step's 9e-4, 2.4e-3, 3e-3), so layer 1 is held to 1/4 and the logits to a loose bound."""
    (want, want0, want1), (got, got0, got1), (fp32, fp0, fp1) = (read(r) for r in runs)
    assert _mean_off(got0, want0) < 0.01 * _mean_off(fp0, want0)
    assert _mean_off(got1, want1) < 0.25 * _mean_off(fp1, want1)
    assert (got - want).abs().max().item() < 0.02 * want.abs().max().item()


@pytest.mark.parametrize("length", [16, 43, 300])
def test_one_call_prefill_equals_the_bf16_twin(models, length):
    """A prompt as one chunk through the one-call step with bf16 activations, against the pure-torch
    twin (and the fp32-activation step as the yardstick)."""
    prompt = [(i * 37) % 4000 + 100 for i in range(length)]
    native, native_bf16, twin = models
    runs = [_runner(m) for m in (twin, native_bf16, native)]
    logits = [r.prefill(0, prompt, 0) for r in runs]
    assert runs[1].fused_decode

    def read(runner):
        cache = runner.kv_cache.tensors
        return (logits[runs.index(runner)], torch.stack([cache.k[0, 0, :, :length], cache.v[0, 0, :, :length]]),
                torch.stack([cache.k[1, 0, :, :length], cache.v[1, 0, :, :length]]))

    check_against_twin(runs, read)


@pytest.mark.parametrize("batch", [8, 3])
def test_decoding_batches_keep_fp32_activations(models, batch):
    """8 (and 3) sequences decoded together after prompts of under 16 tokens: with bf16 activations on,
    every row count stays below the tiles' and the steps' logits and caches are the fp32 step's, bit for bit."""
    native, native_bf16, _ = models
    runs = [_runner(m) for m in (native_bf16, native)]
    for slot in range(batch):
        prompt = [(slot * 101 + i * 13) % 3000 + 50 for i in range(8 + slot)]
        for r in runs:
            r.prefill(slot, prompt, 0, want_logits=False)
    slots = list(range(batch))
    positions = [8 + slot for slot in slots]
    tokens = [200 + slot for slot in slots]
    for _ in range(3):
        got, want = (r.decode(slots, tokens, positions) for r in runs)
        assert torch.equal(got, want)
        tokens = want.argmax(-1).tolist()
        positions = [p + 1 for p in positions]
    # The positions written (each prompt and 3 decoded tokens): the rest of the cache is torch.empty's
    # memory, which may hold anything (a CI worker's earlier tests).
    for slot in slots:
        for a, b in zip(*((r.kv_cache.tensors.k, r.kv_cache.tensors.v) for r in runs)):
            assert torch.equal(a[:, slot, :, :positions[slot]], b[:, slot, :, :positions[slot]])
