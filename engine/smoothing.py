"""Activation-aware smoothing before INT8 (the AWQ idea, without its search): scale each linear's
input channel j by s_j = mean|x_j|^alpha in the weight and by 1/s_j in whatever produces x.

Per-output-channel int8 spends its 255 levels on each weight row's largest entry. Channels whose
activations are large matter most to the output, so enlarging their weights (and shrinking the
activation by the same factor, which is exact in full precision) gives them more of the levels.
Every 1/s folds into the previous op at no runtime cost: the RMSNorm weight for ``qkv`` and
``gate_up``, the ``v`` rows for ``o_proj`` (attention is linear in v), the ``up`` rows for
``down_proj`` (silu(gate) * up is linear in up).
"""
from __future__ import annotations

import torch
from torch import Tensor

from engine.model import Transformer

# Calibration text: generic assistant chat, not the quality-report prompts.
CALIBRATION_TEXT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nCan you help me plan a weekend trip to the mountains? I like hiking and photography."
    "<|im_end|>\n<|im_start|>assistant\nOf course! For a weekend in the mountains, start early on Saturday "
    "so you reach the trailhead before the crowds. Pack water, snacks, a light jacket and a charged camera "
    "battery. Golden hour, just after sunrise and before sunset, gives the best light for landscape photos."
    "<|im_end|>\n<|im_start|>user\nWhat is 17 times 23, and why is the ocean salty?<|im_end|>\n"
    "<|im_start|>assistant\n17 times 23 is 391. The ocean is salty because rivers carry dissolved minerals "
    "from rocks into the sea, and when water evaporates the salt stays behind.<|im_end|>\n"
)


@torch.inference_mode()
def input_channel_means(model: Transformer, token_ids: list[int]) -> dict[str, Tensor]:
    """mean |x| per input channel of every block linear on a calibration sequence -> {name: [K]}."""
    stats: dict[str, Tensor] = {}
    hooks = []
    for i, block in enumerate(model.layers):
        for name, module in (("qkv", block.attn.qkv), ("o_proj", block.attn.o_proj),
                             ("gate_up", block.mlp.gate_up), ("down_proj", block.mlp.down_proj)):
            key = f"{i}.{name}"
            hooks.append(module.register_forward_pre_hook(
                lambda mod, args, key=key: stats.__setitem__(key, args[0].float().abs().flatten(0, -2).mean(0))))
    try:
        tokens = torch.tensor([token_ids])
        model(tokens, torch.arange(len(token_ids))[None])
    finally:
        for hook in hooks:
            hook.remove()
    return stats


def _scales(mean_abs: Tensor, alpha: float) -> Tensor:
    s = mean_abs.clamp(min=1e-5) ** alpha
    return s / (s.max() * s.min()).sqrt()  # centred around 1, so no weight drifts in magnitude


@torch.inference_mode()
def smooth(model: Transformer, stats: dict[str, Tensor], alpha: float = 0.5) -> None:
    """Fold the channel scales into the model (exact in full precision), before quantizing."""
    args = model.args
    R, d = args.num_heads // args.num_kv_heads, args.head_dim
    for i, block in enumerate(model.layers):
        attn, mlp = block.attn, block.mlp
        s = _scales(stats[f"{i}.qkv"], alpha)  # [D]
        block.input_norm.weight.div_(s)
        attn.qkv.weight.mul_(s)
        s = _scales(stats[f"{i}.gate_up"], alpha)
        block.post_attn_norm.weight.div_(s)
        mlp.gate_up.weight.mul_(s)
        # o_proj's input channel (head h, i) comes from v channel (h // R, i): one scale per kv channel.
        per_kv = stats[f"{i}.o_proj"].view(args.num_kv_heads, R, d).amax(1)  # [Hkv, d]
        s_kv = _scales(per_kv.flatten(), alpha)  # [Hkv * d]
        v_rows = slice(attn.q_size + attn.kv_size, None)
        attn.qkv.weight[v_rows].div_(s_kv[:, None])
        if attn.qkv.bias is not None:
            attn.qkv.bias[v_rows].div_(s_kv)
        attn.o_proj.weight.mul_(s_kv.view(args.num_kv_heads, 1, d).expand(-1, R, -1).flatten())
        s = _scales(stats[f"{i}.down_proj"], alpha)  # [I]
        up_rows = slice(mlp.intermediate_size, None)
        mlp.gate_up.weight[up_rows].div_(s[:, None])
        if mlp.gate_up.bias is not None:
            mlp.gate_up.bias[up_rows].div_(s)
        mlp.down_proj.weight.mul_(s)
