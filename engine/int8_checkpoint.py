"""A model quantized once, saved as int8, loaded by memory map: the engine's cold-start format.

Quantizing at every start means dequantizing the whole checkpoint to fp32 first (a GGUF's blocks
in numpy: tens of seconds for Qwen2.5-0.5B here) and then rounding it again. The model store does
it once (``app.model_store``) and writes ``engine-int8.safetensors`` next to the model's
``config.json``; the engine maps that file and builds its int8 layers straight from it.

The file holds ``engine.quant.int8_state``: per-channel int8 weights with their bf16 scales, the
biases and the norms, under our own layer names. ``FORMAT`` names that layout; a file written by a
different layout is ignored (the engine falls back to quantizing at load and says so).
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from torch import Tensor

from engine.loader import INT8_CHECKPOINT_NAME, iter_converted_weights
from engine.model import ModelArgs, Transformer
from engine.quant import int8_state, linear_paths, load_int8_state, quantize_per_channel

log = logging.getLogger(__name__)

FILE_NAME = INT8_CHECKPOINT_NAME
FORMAT = "voxlane-int8-per-channel/1"


def checkpoint_path(model_dir: str | Path) -> Path:
    return Path(model_dir) / FILE_NAME


def save_int8_checkpoint(model: Transformer, path: str | Path) -> Path:
    """Write a quantized model's ``int8_state`` (to a temporary name, renamed when complete)."""
    return _save({name: t.contiguous() for name, t in int8_state(model).items()}, Path(path))


def write_int8_checkpoint(hf_weights: Mapping[str, Tensor], args: ModelArgs, path: str | Path,
                          progress: Callable[[int, int], None] | None = None) -> Path:
    """Quantize HF-named weights tensor by tensor into the checkpoint at ``path``; the same tensors
    as ``int8_state(quantize_int8(model))`` (tested). ``hf_weights`` may dequantize lazily
    (``engine.gguf_weights.GGUFWeights``): only one fp32 tensor is alive at a time. ``progress``
    is called with (layers done, layers) as each layer starts and at the end."""
    linears = {f"{p}.weight" for p in linear_paths(args.num_layers)} | {"lm_head.weight"}
    state: dict[str, Tensor] = {}
    for name, tensor in iter_converted_weights(hf_weights, args):
        if progress is not None and name.endswith("input_norm.weight"):  # a layer's first tensor
            progress(int(name.split(".")[1]), args.num_layers)
        if name in linears or name == "embed.weight":
            prefix = name.removesuffix(".weight")
            if name == "embed.weight":  # tied: the head's table; untied: the embedding's own
                prefix = "lm_head" if args.tie_embeddings else "embed.table"
            state[prefix + ".weight"], state[prefix + ".scales"] = quantize_per_channel(tensor)
        else:  # norms and biases stay float32
            state[name] = tensor.float().contiguous()
        del tensor
    if progress is not None:
        progress(args.num_layers, args.num_layers)
    return _save(state, Path(path))


def _save(state: dict[str, Tensor], path: Path) -> Path:
    from safetensors.torch import save_file

    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")  # each writer its own: the rename is atomic
    save_file(state, str(partial), metadata={"format": FORMAT})
    partial.chmod(0o644)  # readable like the rest of the model directory
    partial.replace(path)
    return path


def has_int8_checkpoint(model_dir: str | Path) -> bool:
    """True when ``model_dir`` holds an int8 checkpoint in today's ``FORMAT``."""
    path = checkpoint_path(model_dir)
    if not path.is_file():
        return False
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        found = (f.metadata() or {}).get("format")
    if found != FORMAT:
        log.warning("%s is in format %r, not %r: quantizing at load instead", path, found, FORMAT)
        return False
    return True


def load_int8_checkpoint(skeleton: Transformer, model_dir: str | Path) -> Transformer:
    """Fill ``skeleton`` (built on the meta device, ``kernels`` set) from the checkpoint's tensors.
    They stay views of the memory map until ``loader.release_file_memory`` copies them."""
    from safetensors.torch import load_file

    return load_int8_state(skeleton, load_file(str(checkpoint_path(model_dir))))
