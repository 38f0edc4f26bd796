"""Native GGUF weights (``quant="native"``): each block format's pure-torch twin equals the ``gguf``
package's dequantizer on real tensors of the packaged files, the C++ kernel equals the twin's
dequantize-then-matmul at batch 1, 3 and 8, and the native model's logits equal the fp32 model
dequantized by transformers from the same file."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from engine import gguf_formats as fmt
from engine import kernels as K
from engine.native_weights import GGUFTensors, QuantWeight, load_native_model


@pytest.fixture(scope="module")
def ops():
    ops = K.load_kernels()
    assert ops is not None, f"the kernels must build on the CI machine (g++ and ninja): {K.unavailable_reason()}"
    return ops


@pytest.fixture(scope="module")
def smollm2_tensors(smollm2_dir) -> GGUFTensors:
    return GGUFTensors(smollm2_dir / "model.gguf")


@pytest.fixture(scope="module")
def smollm2_native(ops, smollm2_dir):
    """SmolLM2's native model (its GGUF blocks, 256 positions), one per test module."""
    return load_native_model(smollm2_dir, 256, ops)


@pytest.fixture(scope="module")
def qwen_tensors() -> GGUFTensors:
    """Qwen2.5-0.5B's GGUF (Q5_0, Q8_0, Q4_K, Q6_K), when its packages are installed."""
    from app import model_store

    try:
        path = model_store.gguf_path("qwen2.5-0.5b-instruct")
    except (AttributeError, model_store.ModelError) as error:
        pytest.skip(f"Qwen2.5-0.5B GGUF not available here ({error}); SmolLM2's Q4_1/Q8_0 are tested regardless")
    return GGUFTensors(path)


def first_rows(weight: QuantWeight, rows: int = 96) -> QuantWeight:
    return QuantWeight(weight.format, weight.blocks[:rows].contiguous(), weight.cols)


def check_format(ops, weight: QuantWeight, gguf_type: int):
    """Twin vs the gguf package, then the kernel vs the twin at batch 1, 3, 8."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    expected = torch.from_numpy(dequantize(weight.blocks.numpy(), GGMLQuantizationType(gguf_type)).astype(np.float32))
    twin = weight.dequantize()
    assert twin.shape == (weight.rows, weight.cols)
    assert torch.allclose(twin, expected, rtol=1e-6, atol=1e-7), "the torch twin differs from gguf's dequantizer"
    assert torch.allclose(ops.quant_dequantize(weight.blocks, weight.format, weight.cols), twin, rtol=1e-6, atol=1e-7)
    g = torch.Generator().manual_seed(weight.format)
    bias = torch.randn(weight.rows, generator=g)
    for M in (1, 3, 8):
        x = torch.randn(M, weight.cols, generator=g)
        reference = (x.double() @ twin.double().T) + bias.double()
        got = ops.quant_linear(x, weight.blocks, weight.format, weight.cols, None, bias)
        scale = reference.abs().max().item()
        assert got.shape == (M, weight.rows)
        assert (got.double() - reference).abs().max().item() < 2e-6 * scale * weight.cols ** 0.5, f"batch {M}"


@pytest.mark.parametrize("name, format", [("blk.0.ffn_down.weight", fmt.Q4_1), ("blk.3.attn_k.weight", fmt.Q4_1),
                                          ("token_embd.weight", fmt.Q8_0)])
def test_smollm2_formats(ops, smollm2_tensors, name, format):
    weight = smollm2_tensors.quant(name)
    assert weight.format == format
    check_format(ops, first_rows(weight), format)


@pytest.mark.parametrize("format", [fmt.Q5_0, fmt.Q8_0, fmt.Q4_K, fmt.Q6_K])
def test_qwen_formats(ops, qwen_tensors, format):
    name = next(n for n, t in qwen_tensors.tensors.items() if t.ggml_type == format and len(t.shape) == 2)
    check_format(ops, first_rows(qwen_tensors.quant(name)), format)


def test_kernel_refuses_bad_input(ops):
    blocks = torch.zeros(4, 20, dtype=torch.uint8)  # 4 rows of one Q4_1 block
    with pytest.raises(RuntimeError, match="multiple of the format's block"):
        ops.quant_linear(torch.zeros(1, 30), blocks, fmt.Q4_1, 30, None, None)
    with pytest.raises(RuntimeError, match="unknown weight format"):
        ops.quant_linear(torch.zeros(1, 32), blocks, 99, 32, None, None)
    with pytest.raises(RuntimeError, match="x: contiguous float32"):
        ops.quant_linear(torch.zeros(1, 64), blocks, fmt.Q4_1, 32, None, None)
    with pytest.raises(RuntimeError, match="token id out of range"):
        ops.quant_embedding(blocks, fmt.Q4_1, 32, None, torch.tensor([4]))


def test_native_model_equals_the_dequantized_file(ops, smollm2_dir, hf_model):
    """Logits of the native model (kernels) against transformers' fp32 model dequantized from the
    same GGUF (the prefill path, 12 tokens), and the pure-torch twin model against both."""
    native = load_native_model(smollm2_dir, 64, ops)
    twin = load_native_model(smollm2_dir, 64, None)
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11, 2, 198, 1]])
    positions = torch.arange(ids.shape[1])[None]
    with torch.inference_mode():
        expected = hf_model(ids).logits[0]
        got = native.logits(native(ids, positions))[0]
        got_twin = twin.logits(twin(ids, positions))[0]
    for logits in (got, got_twin):
        assert (logits - expected).abs().max().item() < 1e-3 * expected.abs().max().item()
        assert torch.equal(logits.argmax(-1), expected.argmax(-1))
    assert native.lm_head.parts[0].blocks.data_ptr() == native.embed.weight_q.blocks.data_ptr()  # tied: one copy


@pytest.fixture(scope="module")
def qwen_dir():
    """The packaged Qwen2.5-0.5B model directory (config, tokenizer, model.gguf), when installed."""
    from app import model_store

    try:
        return model_store.resolve("qwen2.5-0.5b-instruct", "llm")
    except model_store.ModelError as error:
        pytest.skip(f"Qwen2.5-0.5B not available here ({error}); SmolLM2 covers Q4_1/Q8_0 and the one-call step")


def test_qwen_native_model_and_one_call_step(ops, qwen_dir):
    """Qwen2.5-0.5B as stored (Q5_0, Q8_0, Q4_K, Q6_K, qkv biases, untied Q8_0 head): its logits
    equal the fp32 model dequantized from the same file, and the one-call step (batch 1, 3, 8)
    equals the generic forward."""
    from engine.loader import load_model
    from tests.engine.test_kernels import check_one_call_step

    native = load_native_model(qwen_dir, 128, ops)
    formats = {p.format for layer in native.layers for m in (layer.attn.qkv, layer.mlp.down_proj) for p in m.parts}
    assert {fmt.Q5_0, fmt.Q8_0, fmt.Q4_K, fmt.Q6_K} <= formats
    ids = torch.tensor([[151644, 872, 198, 3838, 374, 279, 6722, 315, 9625, 30, 151645, 198]])
    positions = torch.arange(ids.shape[1])[None]
    with torch.inference_mode():
        got = native.logits(native(ids, positions))[0]
        reference = load_model(qwen_dir / "model.gguf", torch.float32, 128)
        expected = reference.logits(reference(ids, positions))[0]
        del reference
    assert (got - expected).abs().max().item() < 1e-3 * expected.abs().max().item()
    assert torch.equal(got.argmax(-1), expected.argmax(-1))
    check_one_call_step(native)


def _smaps_entry(address: int) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping that holds ``address`` (its header line as "range" and "perms")."""
    entry: dict[str, str] = {}
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and not head[0].endswith(":"):
                start, end = (int(x, 16) for x in head[0].split("-"))
                if inside:
                    break
                inside = start <= address < end
                if inside:
                    entry = {"range": head[0], "perms": head[1]}
            elif inside and ":" in line:
                key, value = line.split(":", 1)
                entry[key] = value.strip()
    return entry


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux's /proc/self/smaps")
def test_block_arena_may_have_huge_pages():
    """The weights' arena is a private anonymous mapping, so its MADV_HUGEPAGE counts: a shared one (Python's
    default mmap) is shmem, whose huge pages follow shmem_enabled ("never" by default), and its 2 MB pages were
    never there (the fourteenth session: SmolLM2's 94 MB on 4 KB pages)."""
    from engine.native_weights import BlockArena

    arena = BlockArena(8 << 20)
    rows = arena.copy_rows([np.ones((1024, 4096), dtype=np.uint8)])
    entry = _smaps_entry(rows.data_ptr())
    assert entry["perms"].endswith("p"), entry  # private, not shared ("s")
    enabled = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if enabled.exists() and "[never]" not in enabled.read_text() and "THPeligible" in entry:
        assert entry["THPeligible"] == "1", entry
