"""HF-format checkpoints -> our ``Transformer``: config, tokenizer and weights.

Reads ``config.json`` and the tokenizer with transformers, the weights with safetensors (one file
or shards), and renames/fuses them into our layout (q/k/v -> ``qkv``, gate/up -> ``gate_up``).
A ``.gguf`` file (or a directory whose weights are a ``model.gguf``) is read by ``engine.gguf_file``
and dequantized to fp32 (seconds to tens of seconds). A directory that also holds an int8
checkpoint (``engine.int8_checkpoint``, written once by the model store) loads quantized straight
from it: ``load_int8_model``.
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from torch import Tensor

from engine.model import ModelArgs, Transformer
from engine.rope import rope_frequencies

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")


def model_args_from_config(config) -> ModelArgs:
    """Our ``ModelArgs`` from a transformers config (Llama, Qwen2, Mistral families)."""
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise NotImplementedError(f"model_type {config.model_type!r}: supported are {SUPPORTED_MODEL_TYPES}")
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    qkv_bias = config.model_type == "qwen2" or bool(getattr(config, "attention_bias", False))
    return ModelArgs(
        vocab_size=config.vocab_size,
        dim=config.hidden_size,
        num_layers=config.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        intermediate_size=config.intermediate_size,
        norm_eps=float(config.rms_norm_eps),
        max_position_embeddings=int(getattr(config, "max_position_embeddings", 2048)),
        qkv_bias=qkv_bias,
        o_bias=config.model_type == "llama" and bool(getattr(config, "attention_bias", False)),
        mlp_bias=bool(getattr(config, "mlp_bias", False)),
        tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        # Mistral's window; Qwen2 configs carry one too, but use it only with use_sliding_window
        # (and then only in some layers), which this decoder does not support.
        sliding_window=getattr(config, "sliding_window", None) if config.model_type == "mistral" else None,
    )


def read_hf_weights(model_dir: Path) -> dict[str, Tensor]:
    """All tensors of a safetensors checkpoint (single file or shards), by HF name."""
    from safetensors.torch import load_file

    files = hf_weight_files(model_dir)
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    weights: dict[str, Tensor] = {}
    for file in files:
        weights.update(load_file(str(file)))
    return weights


GGUF_FILE_NAME = "model.gguf"  # the weights of a model directory prepared from a GGUF
INT8_CHECKPOINT_NAME = "engine-int8.safetensors"  # our own int8 layout (engine.int8_checkpoint), not HF weights


def hf_weight_files(model_dir: Path) -> list[Path]:
    """The directory's HF safetensors (single file or shards), not our int8 checkpoint beside them."""
    return sorted(p for p in Path(model_dir).glob("*.safetensors") if p.name != INT8_CHECKPOINT_NAME)


def gguf_file_of(model_path: str | Path) -> Path | None:
    """The GGUF holding the weights: the path itself, or a directory's ``model.gguf`` when it has
    no safetensors."""
    path = Path(model_path)
    if path.suffix == ".gguf":
        return path
    if path.is_dir() and not hf_weight_files(path) and (path / GGUF_FILE_NAME).is_file():
        return path / GGUF_FILE_NAME
    return None


def read_gguf_weights(gguf_path: Path) -> tuple[object, dict[str, Tensor]]:
    """(transformers config, HF-named fp32 tensors) of a GGUF file."""
    from engine.gguf_file import GGUFFile
    from engine.gguf_weights import load_gguf_config, read_gguf_weights as read_weights

    gguf = GGUFFile(gguf_path)
    return load_gguf_config(gguf), read_weights(gguf)


def iter_converted_weights(hf: Mapping[str, Tensor], args: ModelArgs) -> Iterator[tuple[str, Tensor]]:
    """(our name, tensor) pairs from HF-named tensors, fusing q/k/v into ``qkv`` and gate/up into
    ``gate_up``; one at a time, so ``hf`` may produce its tensors lazily."""
    yield "embed.weight", hf["model.embed_tokens.weight"]
    yield "norm.weight", hf["model.norm.weight"]
    if not args.tie_embeddings:
        yield "lm_head.weight", hf["lm_head.weight"]
    for i in range(args.num_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        attn, mlp = src + "self_attn.", src + "mlp."
        yield dst + "input_norm.weight", hf[src + "input_layernorm.weight"]
        yield dst + "post_attn_norm.weight", hf[src + "post_attention_layernorm.weight"]
        yield dst + "attn.qkv.weight", torch.cat([hf[attn + p + ".weight"] for p in ("q_proj", "k_proj", "v_proj")])
        if args.qkv_bias:
            yield dst + "attn.qkv.bias", torch.cat([hf[attn + p + ".bias"] for p in ("q_proj", "k_proj", "v_proj")])
        yield dst + "attn.o_proj.weight", hf[attn + "o_proj.weight"]
        if args.o_bias:
            yield dst + "attn.o_proj.bias", hf[attn + "o_proj.bias"]
        yield dst + "mlp.gate_up.weight", torch.cat([hf[mlp + "gate_proj.weight"], hf[mlp + "up_proj.weight"]])
        yield dst + "mlp.down_proj.weight", hf[mlp + "down_proj.weight"]
        if args.mlp_bias:
            yield dst + "mlp.gate_up.bias", torch.cat([hf[mlp + "gate_proj.bias"], hf[mlp + "up_proj.bias"]])
            yield dst + "mlp.down_proj.bias", hf[mlp + "down_proj.bias"]


def convert_hf_weights(hf: Mapping[str, Tensor], args: ModelArgs) -> dict[str, Tensor]:
    """HF names -> ours, fusing q/k/v into ``qkv`` and gate/up into ``gate_up``."""
    return dict(iter_converted_weights(hf, args))


def _from_pretrained(auto_class, model_path: str | Path):
    """``auto_class.from_pretrained`` on a model directory or a .gguf file, offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = Path(model_path)
    if path.suffix == ".gguf":
        return auto_class.from_pretrained(path.parent, gguf_file=path.name)
    return auto_class.from_pretrained(path)


def load_config(model_path: str | Path):
    """The config of a model directory (or of a .gguf file, from its metadata): its config.json as
    it is when that spells out every key the engine reads (engine/model_config.py), else
    transformers' ``AutoConfig`` (with each model class's defaults)."""
    if Path(model_path).suffix == ".gguf":
        from engine.gguf_file import GGUFFile
        from engine.gguf_weights import load_gguf_config

        return load_gguf_config(GGUFFile(model_path))
    from engine.model_config import read_model_config

    config = read_model_config(model_path)
    if config is not None:
        return config
    from transformers import AutoConfig

    return _from_pretrained(AutoConfig, model_path)


def load_tokenizer(model_path: str | Path):
    """The tokenizer and chat template of a model directory or .gguf file: ``ChatTokenizer`` on
    the directory's tokenizer.json (no transformers import at start), else transformers'
    ``AutoTokenizer``."""
    path = Path(model_path)
    if path.is_dir() and (path / "tokenizer.json").is_file():
        from engine.chat_tokenizer import ChatTokenizer

        return ChatTokenizer(path)
    from transformers import AutoTokenizer

    return _from_pretrained(AutoTokenizer, model_path)


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """``messages`` through the chat template with the assistant's header, as ids. (transformers 5's
    ``apply_chat_template`` returns a BatchEncoding there, ChatTokenizer a list.)"""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def release_file_memory(model: torch.nn.Module) -> None:
    """Copy every tensor of the model into memory of its own, so the checkpoint's memory map is
    released, and hand freed heap back to the OS.

    Why: safetensors tensors live in the mapped file (each with a storage of its own size, so a view
    cannot be told from a copy). After ``quantize_int8`` replaced the linears, the tiny fp32 norm
    weights kept the whole 513 MB mapping resident: the int8 engine measured ~1.0 GB RSS for 130 MB
    of weights. Call it after quantizing (before, it would copy the fp32 linears too).
    """
    owned: dict[int, Tensor] = {}  # by the old tensor's id: a tied weight stays one tensor
    for module in model.modules():
        for name, tensor in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            if tensor is None:
                continue
            if id(tensor) not in owned:
                copy = tensor.detach().clone()
                owned[id(tensor)] = torch.nn.Parameter(copy, requires_grad=False) if isinstance(
                    tensor, torch.nn.Parameter) else copy
            setattr(module, name, owned[id(tensor)])
    trim_heap()


def trim_heap() -> None:
    """Hand freed heap pages back to the OS (glibc's ``malloc_trim``; a no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _skeleton(config, dtype: torch.dtype, max_seq_len: int | None) -> tuple[Transformer, Tensor]:
    """Our ``Transformer`` for ``config`` on the meta device (no random init of weights about to be
    replaced) and its RoPE inverse frequencies."""
    args = model_args_from_config(config)
    if max_seq_len is not None:
        max_seq_len = min(max_seq_len, args.max_position_embeddings)
    inv_freq, attention_factor = rope_frequencies(config, args.head_dim)
    with torch.device("meta"):
        model = Transformer(args, inv_freq, attention_factor, max_seq_len)
    if dtype != torch.float32:
        model = model.to(dtype)
    return model, inv_freq


def _finish(model: Transformer, inv_freq: Tensor, dtype: torch.dtype) -> Transformer:
    model.inv_freq = inv_freq.float()
    model.set_rope_dtype(dtype)
    return model.eval().requires_grad_(False)


def model_from_hf_weights(config, hf_weights: Mapping[str, Tensor], dtype: torch.dtype = torch.float32,
                          max_seq_len: int | None = None) -> Transformer:
    """Our ``Transformer`` from a transformers config and HF-named tensors, in ``dtype``."""
    model, inv_freq = _skeleton(config, torch.float32, max_seq_len)
    weights = convert_hf_weights(hf_weights, model.args)
    if model.args.tie_embeddings:  # the head *is* the embedding: one tensor, loaded once
        weights["lm_head.weight"] = weights["embed.weight"]
    model.load_state_dict(weights, strict=True, assign=True)
    if model.args.tie_embeddings:
        model.lm_head.weight = model.embed.weight
    return _finish(model.to(dtype), inv_freq, dtype)


def load_model(model_path: str | Path, dtype: torch.dtype = torch.float32, max_seq_len: int | None = None) -> Transformer:
    """Build our ``Transformer`` from an HF directory (safetensors) or a GGUF, in ``dtype``."""
    gguf = gguf_file_of(model_path)
    if gguf is not None:
        config, hf_weights = read_gguf_weights(gguf)
    else:
        config, hf_weights = load_config(model_path), read_hf_weights(Path(model_path))
    return model_from_hf_weights(config, hf_weights, dtype, max_seq_len)


def load_int8_model(model_dir: str | Path, dtype: torch.dtype = torch.float32, max_seq_len: int | None = None,
                    kernels=None) -> Transformer:
    """Our int8 ``Transformer`` from a directory's int8 checkpoint (see ``engine.int8_checkpoint``)."""
    from engine.int8_checkpoint import load_int8_checkpoint

    model, inv_freq = _skeleton(load_config(model_dir), dtype, max_seq_len)
    model.kernels = kernels
    return _finish(load_int8_checkpoint(model, model_dir), inv_freq, dtype)
