"""The batch-1 products (one activation row: a decode step's matrices; engine/gemv512.h on an AVX-512
machine, quant_matmul.h's AVX2 or scalar code elsewhere) against the pure-torch dequantize-then-matmul
twin, on synthetic blocks that reach what real files rarely show at once: every nibble and byte
value, negative and subnormal fp16 scales, negative and positive mins, a row count that is not a
multiple of the kernel's 4-row groups, and block counts below, at and past its groups of 16 blocks."""
from __future__ import annotations

import pytest
import torch

from engine import gguf_formats as fmt
from tests.engine.test_native_weights import ops  # noqa: F401 (fixture)

ROWS = 23  # 5 groups of 4 and a tail of 3
COLS = (32, 512, 576, 1536)  # 1, 16, 18 (16 + a tail of 2), 48 blocks of 32


def random_blocks(format: int, rows: int, cols: int, g: torch.Generator) -> torch.Tensor:
    """Rows of random blocks: random bytes for the values, fp16 scales (and Q4_1's min) of either sign
    between ~1e-7 (subnormal) and ~0.1."""
    qk, nbytes = fmt.GEOMETRY[format]
    n = rows * cols // qk
    blocks = torch.randint(0, 256, (n, nbytes), dtype=torch.uint8, generator=g)
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    d = (sign * 10 ** (-7 + 6 * torch.rand(n, generator=g))).half()
    blocks[:, 0:2] = d.view(torch.uint8).view(n, 2)
    if format == fmt.Q4_1:
        m = (-8 * d.float() * (0.5 + torch.rand(n, generator=g)) * torch.where(torch.rand(n, generator=g) < 0.8, 1, -1)).half()
        blocks[:, 2:4] = m.view(torch.uint8).view(n, 2)
    return blocks.view(rows, cols // qk * nbytes)


def check(ops, blocks, format, cols, twin, row_scale=None, bias=None):
    g = torch.Generator().manual_seed(cols)
    for mean in (0.0, 1.0):  # a mean far from 0 makes Q4_1's d * sum(q x) and m * sum(x) cancel
        x = torch.randn(1, cols, generator=g) + mean
        reference = x.double() @ twin.double().T
        if bias is not None:
            reference += bias.double()
        got = ops.quant_linear(x, blocks, format, cols, row_scale, bias)
        assert got.shape == (1, twin.shape[0])
        # each row against its own scale: rows of tiny (subnormal) scales too
        err = (got.double() - reference).abs()[0]
        size = (x.double().abs() @ twin.double().abs().T)[0]  # sum |x w| (+ |bias|): fp32 rounding is relative to it
        if bias is not None:
            size += bias.double().abs()
        assert (err <= 1e-5 * size + 1e-30).all(), f"{fmt.NAMES[format]}, {cols} columns, worst row {int((err / size).argmax())}"


@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("format", [fmt.Q4_0, fmt.Q4_1, fmt.Q8_0])
def test_gguf_blocks_batch_1(ops, format, cols):
    g = torch.Generator().manual_seed(format * 7919 + cols)
    blocks = random_blocks(format, ROWS, cols, g)
    twin = fmt.dequantize(blocks, format, cols)
    assert torch.isfinite(twin).all()
    check(ops, blocks, format, cols, twin, bias=torch.randn(ROWS, generator=g))
    check(ops, blocks, format, cols, twin)


@pytest.mark.parametrize("cols", [16, 48, 576, 1536])
def test_int8_per_channel_batch_1(ops, cols):
    """Our I8 rows (the default ``quant``): every byte value, the row scale applied to the row's sum."""
    g = torch.Generator().manual_seed(cols)
    q = torch.randint(-128, 128, (ROWS, cols), dtype=torch.int8, generator=g)
    q[0, :] = torch.arange(cols) % 256 - 128
    scale = torch.rand(ROWS, generator=g) / 50
    twin = fmt.dequantize(q.view(torch.uint8), fmt.I8, cols, scale)
    check(ops, q.view(torch.uint8), fmt.I8, cols, twin, row_scale=scale, bias=torch.randn(ROWS, generator=g))
