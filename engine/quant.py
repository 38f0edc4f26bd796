"""Weight-only INT8, swapped into a loaded model from outside it (gpt-fast's shape).

Every linear layer and the LM head keep an int8 weight [N, K] and one scale per output channel
(symmetric, scale = max|w_row| / 127). The matmul is ``torch.ops.aten._weight_int8pack_mm`` (int8
weights, bf16 activations and scales, bf16 out), measured fastest here among the candidates
(docs/engine.md); only the matmul input is cast to bf16, the model's own activations (residual
stream, norms, attention, KV cache) stay in the configured dtype: with fp32 there, greedy agreement
with the fp32 model measured 0.95-0.96, with bf16 everywhere only 0.93. A tied embedding shares the
head's int8 table and scales (row scale = output-channel scale): the largest tensor is stored once.

Not ``torch.ao.quantization.quantize_dynamic``: its per-tensor *activation* quantization changes
SmolLM2's first generated token (top-1 agreement with fp32 0.50-0.62, measured).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.model import Transformer


def quantize_per_channel(weight: Tensor) -> tuple[Tensor, Tensor]:
    """weight [N, K] float -> (int8 [N, K], scales [N] bf16), symmetric per output row.

    The kernel multiplies by bf16 scales, so the scale is rounded to bf16 (upwards, so no weight
    overflows 127) *before* quantizing: the int8 values are then exact for the scale actually used.
    """
    w = weight.float()
    scales = (w.abs().amax(dim=1).clamp(min=1e-8) / 127.0)
    rounded = scales.to(torch.bfloat16)
    too_small = rounded.float() < scales
    rounded[too_small] = torch.nextafter(rounded[too_small], torch.full_like(rounded[too_small], float("inf")))
    q = torch.round(w / rounded.float()[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), rounded


def gemm_rows(rows: int) -> int:
    """``rows`` rounded up to one of 8 sizes per octave (..., 64, 72, 80, ..., 120, 128, 144, ...).

    Why: oneDNN compiles and caches one bf16 GEMM per distinct shape, about 0.55 MB each, kept for
    the life of the process (up to 1,024 of them); prompt chunks come in every length, so a server
    grew 2.2 MB per new prefill length of 64+ tokens (measured, 4 weight shapes). Padded, a few
    shapes serve all lengths, at most 1/8 of the rows wasted.
    """
    step = 1 << max(0, rows.bit_length() - 4)
    return -(-rows // step) * step


class Int8Linear(nn.Module):
    """y = x @ (int8 W * scale).T + b, for every linear layer; three ways, by input:

    * fp32 activations and fewer than ``kernel_below_rows`` rows (decode, short prefills), when
      ``kernels`` (engine/kernels.cpp) are loaded: ``voxlane::int8_linear`` reads the int8 weights
      directly and accumulates in fp32. Its cost grows with the rows; the dequantize + GEMM path
      below costs a fixed ~70 ms per forward (converting all weights) plus little per row, and they
      cross at ~64 rows (measured over the whole model: 48 rows 66 vs 80 ms, 96 rows 124 vs 96 ms).
    * otherwise, few rows: ``_weight_int8pack_mm`` with bf16 activations, bf16 out (the pure-torch
      path, also used for bf16 activations).
    * ``dequantize_from_rows`` rows or more (prefill chunks): the weight is dequantized to bf16 for
      the call and multiplied by the bf16 GEMM, measured 3-5x faster at 64-256 rows (docs/engine.md).
    """

    dequantize_from_rows = 32
    kernel_below_rows = 64

    def __init__(self, weight_int8: Tensor, scales: Tensor, bias: Tensor | None, kernels=None):
        super().__init__()
        self.out_features, self.in_features = weight_int8.shape
        self.kernels = kernels  # torch.ops.voxlane, or None for the pure-torch path
        self.register_buffer("weight", weight_int8)  # [N, K] int8
        self.register_buffer("scales", scales.to(torch.bfloat16))  # [N]; _weight_int8pack_mm wants bf16 like x
        self.register_buffer("scales_f32", self.scales.float())  # the same values for the fp32 kernel
        self.register_buffer("bias", None if bias is None else bias.float())

    @classmethod
    def from_linear(cls, linear: nn.Linear, kernels=None) -> "Int8Linear":
        q, scales = quantize_per_channel(linear.weight.data)
        return cls(q, scales, None if linear.bias is None else linear.bias.data, kernels)

    def uses_kernel(self, x: Tensor) -> bool:
        """Whether ``x`` goes through the exact fp32 kernel."""
        rows = x.numel() // self.in_features
        return self.kernels is not None and x.dtype == torch.float32 and rows < self.kernel_below_rows

    def forward(self, x: Tensor) -> Tensor:
        if self.uses_kernel(x):
            if x.dim() == 2:  # the fused decode step's [B, K] rows: no reshape and view
                return self.kernels.int8_linear(x.contiguous(), self.weight, self.scales_f32, self.bias)
            y = self.kernels.int8_linear(x.reshape(-1, self.in_features).contiguous(), self.weight,
                                         self.scales_f32, self.bias)
            return y.view(*x.shape[:-1], self.out_features)
        dtype = x.dtype
        x2 = x.reshape(-1, self.in_features)
        # The torch kernels take a contiguous bf16 [M, K]; with fp32 activations the cast makes the
        # copy (the bf16 kernel is ~10x faster than the fp32-activation one, measured).
        x2 = x2.to(torch.bfloat16) if dtype != torch.bfloat16 else x2.contiguous()
        if (M := x2.shape[0]) >= self.dequantize_from_rows:  # prefill: a temporary bf16 weight, then GEMM
            # int8 values are exact in bf16; the scale is applied to the fp32 output, not folded
            # into the weight (that extra bf16 rounding measurably cost agreement).
            x2 = F.pad(x2, (0, 0, 0, gemm_rows(M) - M))  # zero rows up to a cached GEMM shape
            y = torch.mm(x2, self.weight.to(torch.bfloat16).T)[:M].float() * self.scales_f32
        else:
            y = torch.ops.aten._weight_int8pack_mm(x2, self.weight, self.scales)  # [M, N] bf16
        if self.bias is not None:
            y = y.float() + self.bias
        return y.view(*x.shape[:-1], self.out_features).to(dtype)


class Int8Head(Int8Linear):
    """The LM head. Through the fp32 kernel its logits are exact for the int8 weights. Through the
    bf16 kernel, the top ``refine_top_k`` logits are then recomputed exactly (fp32 activations times
    the same int8 weights).

    Why: that kernel returns bf16, and a logit near 20 in bf16 is only good to +-0.06, enough to swap
    two near-tied candidates. Measured on SmolLM2: the int8 head alone agreed with fp32's greedy
    token 0.959 of the time (the first answer token wrong on 1 of 5 prompts); refined, 0.985 and 5/5.
    The refinement costs a top-k and a [k, D] product per row.
    """

    refine_top_k = 16

    def forward(self, x: Tensor) -> Tensor:
        logits = super().forward(x).float()  # [..., V]
        if self.uses_kernel(x):
            return logits
        flat, rows = logits.view(-1, self.out_features), x.reshape(-1, self.in_features).float()  # [M, V], [M, D]
        top = flat.topk(self.refine_top_k, dim=-1).indices  # [M, k]
        weights = self.weight[top].float() * self.scales_f32[top].unsqueeze(-1)  # [M, k, D]
        flat.scatter_(1, top, torch.einsum("mkd,md->mk", weights, rows))
        return logits


class Int8Embedding(nn.Module):
    """Embedding lookup from an int8 table with per-row scales: the tied head's own table (shared,
    stored once), or a table of its own for an untied model (Qwen2's GGUFs carry both)."""

    def __init__(self, table: Int8Linear, dtype: torch.dtype, shared: bool):
        super().__init__()
        if shared:
            self._shared = [table]  # a list: not registered twice as a submodule
        else:
            self.table = table
        self.dtype = dtype

    def forward(self, ids: Tensor) -> Tensor:
        table = self._shared[0] if hasattr(self, "_shared") else self.table
        rows = F.embedding(ids, table.weight).to(self.dtype)  # [..., D]
        return rows * table.scales_f32[ids].unsqueeze(-1).to(self.dtype)


def linear_paths(num_layers: int) -> list[str]:
    """The dotted names of every linear layer in the block stack (the head not included)."""
    return [f"layers.{i}.{name}" for i in range(num_layers)
            for name in ("attn.qkv", "attn.o_proj", "mlp.gate_up", "mlp.down_proj")]


def _swap(model: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, leaf = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)


def quantize_int8(model: Transformer) -> Transformer:
    """Replace every linear (attention, MLP, LM head) with an ``Int8Linear``, in place; they use
    the model's fused kernels (``model.kernels``, set before) for fp32 decode rows. An untied
    embedding becomes an int8 table too (per-row scales)."""
    dtype, kernels = model.norm.weight.dtype, model.kernels
    for path in linear_paths(len(model.layers)):
        _swap(model, path, Int8Linear.from_linear(model.get_submodule(path), kernels))
    head = Int8Head.from_linear(model.lm_head, kernels)
    if model.args.tie_embeddings:
        model.embed = Int8Embedding(head, dtype, shared=True)
    else:
        q, scales = quantize_per_channel(model.embed.weight.data)
        model.embed = Int8Embedding(Int8Linear(q, scales, None), dtype, shared=False)
    model.lm_head = head
    return model


def int8_state(model: Transformer) -> dict[str, Tensor]:
    """What a quantized model is made of: int8 weights, bf16 scales, biases and norms (derived
    buffers such as ``scales_f32`` and the RoPE tables left out). The inverse of ``load_int8_state``."""
    return {name: t for name, t in model.state_dict().items() if not name.endswith("scales_f32")}


def load_int8_state(model: Transformer, state: dict[str, Tensor]) -> Transformer:
    """Fill a model skeleton (built on the meta device) from ``int8_state``'s tensors, in place:
    no fp32 weight is ever materialized, so a prepared int8 checkpoint loads in a second."""
    dtype, kernels = model.norm.weight.dtype, model.kernels

    def linear(prefix: str, cls: type[Int8Linear] = Int8Linear) -> Int8Linear:
        return cls(state[prefix + ".weight"], state[prefix + ".scales"], state.get(prefix + ".bias"), kernels)

    for path in linear_paths(len(model.layers)):
        _swap(model, path, linear(path))
    head = linear("lm_head", Int8Head)
    model.embed = (Int8Embedding(head, dtype, shared=True) if model.args.tie_embeddings
                   else Int8Embedding(linear("embed.table"), dtype, shared=False))
    model.lm_head = head
    norms = {name: t.to(dtype) for name, t in state.items() if name.endswith("norm.weight")}
    model.load_state_dict(norms, strict=False, assign=True)
    unfilled = [name for name, t in model.state_dict().items() if t.is_meta]
    if unfilled:
        raise ValueError(f"int8 state: no tensor for {unfilled[:3]} ({len(unfilled)} in all)")
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
