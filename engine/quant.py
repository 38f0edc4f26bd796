"""Weight-only INT8, swapped into a loaded model from outside it (gpt-fast's shape).

Every linear layer and the LM head keep an int8 weight [N, K] and one scale per output channel
(symmetric, scale = max|w_row| / 127); activations stay bf16. The matmul is
``torch.ops.aten._weight_int8pack_mm`` (int8 weights, bf16 activations, per-channel scales), which
measured fastest here among the candidates (docs/engine.md): it reads a quarter of fp32's bytes and
at batch 1 decode is bound by exactly those reads. A tied embedding shares the head's int8 table and
scales (one row scale = one output-channel scale), so the largest tensor is stored once, in int8.

Not ``torch.ao.quantization.quantize_dynamic``: its per-tensor *activation* quantization changes
SmolLM2's first generated token (top-1 agreement with fp32 0.50-0.62, measured).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.model import Transformer


def quantize_per_channel(weight: Tensor) -> tuple[Tensor, Tensor]:
    """weight [N, K] float -> (int8 [N, K], scales [N] float32), symmetric per output row."""
    w = weight.float()
    scales = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scales


class Int8Linear(nn.Module):
    """y = x @ (int8 W * scale).T + b, computed by ``_weight_int8pack_mm`` with bf16 activations."""

    def __init__(self, weight_int8: Tensor, scales: Tensor, bias: Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight_int8.shape
        self.register_buffer("weight", weight_int8)  # [N, K] int8
        self.register_buffer("scales", scales.to(torch.bfloat16))  # [N]; the kernel wants x's dtype
        self.register_buffer("bias", None if bias is None else bias.to(torch.bfloat16))

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Int8Linear":
        q, scales = quantize_per_channel(linear.weight.data)
        return cls(q, scales, None if linear.bias is None else linear.bias.data)

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x2 = x.reshape(-1, self.in_features)  # the kernel takes [M, K]
        if dtype != torch.bfloat16:  # fp32 activations: the bf16 kernel is ~10x faster than fp32's
            x2 = x2.to(torch.bfloat16)
        y = torch.ops.aten._weight_int8pack_mm(x2.contiguous(), self.weight, self.scales)  # [M, N]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(dtype)


class Int8Embedding(nn.Module):
    """Embedding lookup from an int8 table with per-row scales (shared with a tied Int8Linear head)."""

    def __init__(self, head: Int8Linear, dtype: torch.dtype):
        super().__init__()
        self.head = [head]  # a list: not registered twice as a submodule
        self.dtype = dtype

    def forward(self, ids: Tensor) -> Tensor:
        head = self.head[0]
        rows = F.embedding(ids, head.weight).to(self.dtype)  # [..., D]
        return rows * head.scales[ids].unsqueeze(-1).to(self.dtype)


def quantize_int8(model: Transformer) -> Transformer:
    """Replace every linear (attention, MLP, LM head) with an ``Int8Linear``, in place."""
    dtype = model.norm.weight.dtype
    for block in model.layers:
        block.attn.qkv = Int8Linear.from_linear(block.attn.qkv)
        block.attn.o_proj = Int8Linear.from_linear(block.attn.o_proj)
        block.mlp.gate_up = Int8Linear.from_linear(block.mlp.gate_up)
        block.mlp.down_proj = Int8Linear.from_linear(block.mlp.down_proj)
    head = Int8Linear.from_linear(model.lm_head)
    if model.args.tie_embeddings:
        model.embed = Int8Embedding(head, dtype)
    model.lm_head = head
    return model


def weight_bytes(model: nn.Module) -> int:
    """Bytes of parameters and persistent buffers, each storage counted once (tied weights)."""
    seen: set[int] = set()
    total = 0
    tensors = list(model.parameters()) + [b for name, b in model.named_buffers()
                                          if not name.startswith(("rope_", "inv_freq"))]
    for t in tensors:
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total
