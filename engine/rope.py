"""RoPE frequencies from an HF config: the default and the common ``rope_scaling`` kinds.

``default`` and ``linear`` and ``llama3`` are computed here (short, and what Llama/SmolLM2/Qwen2/
Mistral checkpoints use); other kinds (yarn, longrope, dynamic, ...) are delegated to transformers'
own ``ROPE_INIT_FUNCTIONS`` so they match the reference exactly.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor


def rope_parameters(config) -> dict:
    """The rope settings as one dict, whether the config uses transformers 5's ``rope_parameters``
    or the older ``rope_theta`` + ``rope_scaling`` pair."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    scaling = getattr(config, "rope_scaling", None) or {}
    for key, value in scaling.items():
        params.setdefault(key, value)
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params["type"]
    params.setdefault("rope_type", "default")
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return params


def rope_frequencies(config, head_dim: int) -> tuple[Tensor, float]:
    """(inv_freq [head_dim/2] float32, attention_factor) for the config's RoPE kind."""
    params = rope_parameters(config)
    kind = params["rope_type"]
    base = float(params["rope_theta"])
    rotary_dim = int(head_dim * float(getattr(config, "partial_rotary_factor", 1.0) or 1.0))
    if rotary_dim != head_dim:
        raise NotImplementedError("partial rotary embeddings are not supported by this decoder")
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / float(params["factor"]), 1.0
    if kind == "llama3":
        return _llama3(inv_freq, params), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if kind not in ROPE_INIT_FUNCTIONS:
        raise NotImplementedError(f"rope_type {kind!r} is not supported")
    inv, factor = ROPE_INIT_FUNCTIONS[kind](config, torch.device("cpu"))
    return inv.float(), float(factor)


def _llama3(inv_freq: Tensor, params: dict) -> Tensor:
    """Llama 3.1's smooth split: long wavelengths scaled by ``factor``, short ones kept."""
    factor = float(params["factor"])
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    old_len = float(params["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)
