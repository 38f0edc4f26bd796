"""GGUF block formats in pure torch: the readable twins of ``engine/gguf_blocks.h``.

A quantized matrix is kept as the file stores it: uint8 ``blocks`` [N, row_bytes], each row the
blocks of one output row (K weights). ``dequantize(blocks, format, K)`` -> fp32 [N, K] is what the
C++ kernels must agree with (tested), and what the pure-torch path multiplies by when no compiler
is available. The formulas are ggml's (``ggml-quants.c``'s ``dequantize_row_*``):

  format  weights/block  bytes  layout                                           weight
  Q4_0    32             18     fp16 d | 16 B nibbles (low: 0-15, high: 16-31)    (q - 8) d
  Q4_1    32             20     fp16 d | fp16 m | 16 B nibbles                    q d + m
  Q5_0    32             22     fp16 d | u32 5th bits | 16 B nibbles              (q - 16) d
  Q8_0    32             34     fp16 d | 32 int8                                  q d
  Q4_K    256            144    fp16 d | fp16 dmin | 12 B six-bit (sc, m) x 8 | 128 B nibbles
                                                                                  q d sc_j - dmin m_j
  Q6_K    256            210    128 B low nibbles | 64 B high 2 bits | 16 int8 scales | fp16 d
                                                                                  (q - 32) d sc_j
"""
from __future__ import annotations

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from torch import Tensor

F32, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K = 0, 2, 3, 6, 8, 12, 14  # ggml type ids
I8 = 1000  # ours: per-output-channel int8 (engine.quant), a row scale outside the blocks
NAMES = {F32: "F32", Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0", Q8_0: "Q8_0", Q4_K: "Q4_K", Q6_K: "Q6_K", I8: "I8"}
# (weights per block, bytes per block), as the gguf package states them for the file's reader
GEOMETRY = {t: GGML_QUANT_SIZES[GGMLQuantizationType(t)] for t in (F32, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K)}
GEOMETRY[I8] = (1, 1)


def row_bytes(format: int, cols: int) -> int:
    qk, nbytes = GEOMETRY[format]
    if cols % qk:
        raise ValueError(f"{NAMES[format]}: {cols} columns is not a multiple of its block of {qk}")
    return cols // qk * nbytes


def _f16(blocks: Tensor, at: int) -> Tensor:
    """The fp16 at byte ``at`` of every block, as fp32 [n, 1]."""
    return blocks[:, at: at + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: Tensor) -> Tensor:
    """[n, B] bytes -> [n, 2B]: the low nibbles, then the high nibbles."""
    return torch.cat([qs & 0xF, qs >> 4], dim=-1)


def _q4_k_scales(s: Tensor) -> tuple[Tensor, Tensor]:
    """Q4_K's 12 bytes -> (scales, mins) [n, 8]: six bits each (ggml's get_scale_min_k4)."""
    s = s.long()
    low_scales, low_mins = s[:, 0:4] & 63, s[:, 4:8] & 63
    high_scales = (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)
    high_mins = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return torch.cat([low_scales, high_scales], 1), torch.cat([low_mins, high_mins], 1)


def dequantize_blocks(blocks: Tensor, format: int) -> Tensor:
    """[n, bytes per block] uint8 -> [n, weights per block] fp32."""
    if format == Q8_0:
        return blocks[:, 2:].contiguous().view(torch.int8).float() * _f16(blocks, 0)
    if format == Q4_0:
        return (_nibbles(blocks[:, 2:]).float() - 8) * _f16(blocks, 0)
    if format == Q4_1:
        return _nibbles(blocks[:, 4:]).float() * _f16(blocks, 0) + _f16(blocks, 2)
    if format == Q5_0:
        high_bits = (blocks[:, 2:6].long() << torch.tensor([0, 8, 16, 24])).sum(1, keepdim=True)  # u32 [n, 1]
        fifth = (high_bits >> torch.arange(32)) & 1  # [n, 32]: weight i's 5th bit is bit i
        return ((_nibbles(blocks[:, 6:]).long() | (fifth << 4)) - 16).float() * _f16(blocks, 0)
    if format == Q4_K:
        scales, mins = _q4_k_scales(blocks[:, 4:16])
        # 4 chunks of 32 bytes: each gives 32 weights from its low nibbles, then 32 from its high.
        q = _nibbles(blocks[:, 16:].reshape(-1, 32)).reshape(-1, 8, 32).float()  # [n, sub-block, 32]
        d, dmin = _f16(blocks, 0)[:, :, None], _f16(blocks, 2)[:, :, None]
        return (d * scales[:, :, None] * q - dmin * mins[:, :, None]).reshape(-1, 256)
    if format == Q6_K:
        n = blocks.shape[0]
        ql = blocks[:, :128].reshape(n, 2, 64).long()  # per half of 128 weights
        qh = blocks[:, 128:192].reshape(n, 2, 32).long()
        low = torch.cat([ql[..., :32] & 0xF, ql[..., 32:] & 0xF, ql[..., :32] >> 4, ql[..., 32:] >> 4], -1)
        high = torch.cat([(qh >> shift) & 3 for shift in (0, 2, 4, 6)], -1)  # [n, 2, 128]
        q = ((low | (high << 4)) - 32).float().reshape(n, 16, 16)  # 16 sub-blocks of 16
        scales = blocks[:, 192:208].contiguous().view(torch.int8).float()[:, :, None]
        return (_f16(blocks, 208)[:, :, None] * scales * q).reshape(n, 256)
    raise ValueError(f"no dequantizer for format {NAMES.get(format, format)}")


def dequantize(blocks: Tensor, format: int, cols: int, row_scale: Tensor | None = None) -> Tensor:
    """A matrix's rows of blocks [N, row_bytes] uint8 -> fp32 [N, cols]."""
    if format == F32:
        return blocks.contiguous().view(torch.float32).reshape(-1, cols)
    if format == I8:
        return blocks.view(torch.int8).float() * row_scale[:, None]
    qk, nbytes = GEOMETRY[format]
    rows = blocks.shape[0]
    return dequantize_blocks(blocks.reshape(-1, nbytes), format).reshape(rows, cols)
