"""The one-call decode step: our ``Transformer`` described to ``torch.classes.voxlane.NativeDecoder``
(engine/decode_step.cpp), which then runs a whole decode step, LM head included, in one C++ call.

Every weight mode maps onto it: the GGUF's own blocks (``NativeLinear``), our per-channel int8
(``Int8Linear``: format I8 with its row scales) and fp32 (``nn.Linear``). The pure-torch forward
(``Transformer.forward``) stays the readable reference it is tested against.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from engine import gguf_formats as fmt
from engine.model import KVCacheTensors, Transformer
from engine.native_weights import NativeEmbedding, NativeLinear, pack_r16
from engine.quant import Int8Embedding, Int8Linear


def _as_bytes(weight: Tensor) -> Tensor:
    """A contiguous [N, K] tensor seen as uint8 rows [N, K * itemsize] (no copy)."""
    return weight.contiguous().view(torch.uint8)


def linear_segments(module: nn.Module) -> tuple[list[tuple[Tensor, int, int, Tensor | None, bool]], Tensor | None]:
    """([(blocks, format, cols, row_scale, r16)], bias) of one linear layer, in any weight mode (r16: the
    blocks are in the R16 layout, ``pack_r16``)."""
    if isinstance(module, NativeLinear):
        return [(p.blocks, p.format, p.cols, p.row_scale, p.r16) for p in module.parts], module.bias
    if isinstance(module, Int8Linear):
        return [(_as_bytes(module.weight), fmt.I8, module.in_features, module.scales_f32, False)], module.bias
    if isinstance(module, nn.Linear):
        weight = module.weight.detach().float()
        bias = None if module.bias is None else module.bias.detach().float().contiguous()
        return [(_as_bytes(weight), fmt.F32, module.in_features, None, False)], bias
    raise TypeError(f"no native form for {type(module).__name__}")


def embedding_segment(module: nn.Module) -> tuple[Tensor, int, int, Tensor | None, bool]:
    if isinstance(module, NativeEmbedding):
        w = module.weight_q
        return w.blocks, w.format, w.cols, w.row_scale, w.r16
    if isinstance(module, Int8Embedding):
        table = module._shared[0] if hasattr(module, "_shared") else module.table
        return _as_bytes(table.weight), fmt.I8, table.in_features, table.scales_f32, False
    if isinstance(module, nn.Embedding):
        return _as_bytes(module.weight.detach().float()), fmt.F32, module.embedding_dim, None, False
    raise TypeError(f"no native form for {type(module).__name__}")


def supports(model: Transformer, cache: KVCacheTensors) -> bool:
    """Whether the model can run the one-call step: kernels loaded, fp32 activations and cache."""
    return (model.kernels is not None and cache.k.dtype == torch.float32 and model.norm.weight.dtype == torch.float32
            and hasattr(torch.classes.voxlane, "NativeDecoder"))


def build_decoder(model: Transformer, cache: KVCacheTensors):
    """A ``NativeDecoder`` over the model's weights (shared, not copied) and the cache tensors. With
    ``model.int16_activations`` the model's Q4_0 / Q4_1 / Q8_0 matrices are first packed in place in the
    R16 layout (``pack_r16``; once: the model keeps that layout for every later decoder)."""
    args = model.args
    int16 = bool(getattr(model, "int16_activations", False))
    if int16:
        pack_r16(model, model.kernels)
    decoder = torch.classes.voxlane.NativeDecoder(
        args.dim, args.num_heads, args.num_kv_heads, args.head_dim, args.intermediate_size, args.num_layers,
        float(args.norm_eps), int(args.sliding_window or 0), model.rope_cos.contiguous(), model.rope_sin.contiguous(),
        cache.k, cache.v)

    def add(layer: int, role: str, module: nn.Module) -> None:
        segments, bias = linear_segments(module)
        for i, (blocks, format, cols, row_scale, r16) in enumerate(segments):
            decoder.add_linear(layer, role, blocks, format, cols, row_scale, bias if i == 0 else None, r16)

    for i, block in enumerate(model.layers):
        decoder.add_norm(i, "input", block.input_norm.weight.detach())
        decoder.add_norm(i, "post", block.post_attn_norm.weight.detach())
        add(i, "qkv", block.attn.qkv)
        add(i, "o", block.attn.o_proj)
        add(i, "gate_up", block.mlp.gate_up)
        add(i, "down", block.mlp.down_proj)
    decoder.add_norm(-1, "final", model.norm.weight.detach())
    add(-1, "head", model.lm_head)
    blocks, format, cols, row_scale, r16 = embedding_segment(model.embed)
    decoder.add_linear(-1, "embed", blocks, format, cols, row_scale, None, r16)
    decoder.set_int8_activations(bool(model.int8_activations))
    decoder.set_bf16_activations(bool(model.bf16_activations))
    decoder.set_int16_activations(int16)
    return decoder
