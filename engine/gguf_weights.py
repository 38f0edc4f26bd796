"""A GGUF checkpoint (Llama or Qwen2 architecture) -> a transformers config and HF-named fp32 weights.

The engine then loads them like any HF checkpoint (``engine.loader.convert_hf_weights``). Names
follow llama.cpp's converter in reverse (``blk.N.attn_q.weight`` -> ``model.layers.N.self_attn.
q_proj.weight``); for the ``llama`` architecture llama.cpp also permuted the rows of q and k (its
RoPE pairs adjacent elements, HF's pairs the two halves), which is undone here. Qwen2 files are not
permuted (llama.cpp runs Qwen2 with the half-split "NeoX" RoPE).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping

from torch import Tensor

from engine.gguf_file import GGUFError, GGUFFile

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")

_TOP_LEVEL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
_IN_BLOCK = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def hf_name(gguf_name: str) -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``."""
    if gguf_name in _TOP_LEVEL:
        return _TOP_LEVEL[gguf_name]
    prefix, index, rest = gguf_name.split(".", 2) if gguf_name.startswith("blk.") else ("", "", gguf_name)
    if not prefix or rest not in _IN_BLOCK:
        raise GGUFError(f"tensor {gguf_name!r} has no counterpart in a Llama/Qwen2 checkpoint")
    return f"model.layers.{index}.{_IN_BLOCK[rest]}"


def config_kwargs(gguf: GGUFFile) -> dict:
    """The transformers config fields of the file's architecture, from its metadata."""
    arch = gguf.architecture
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFError(f"{gguf.path}: architecture {arch!r}; supported are {SUPPORTED_ARCHITECTURES}")
    heads = int(gguf.field("attention.head_count"))
    dim = int(gguf.field("embedding_length"))
    meta = gguf.metadata
    kwargs = dict(
        vocab_size=len(meta["tokenizer.ggml.tokens"]),
        hidden_size=dim,
        intermediate_size=int(gguf.field("feed_forward_length")),
        num_hidden_layers=int(gguf.field("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(gguf.field("attention.head_count_kv", heads)),
        head_dim=int(gguf.field("attention.key_length", dim // heads)),
        rms_norm_eps=float(gguf.field("attention.layer_norm_rms_epsilon", 1e-6)),
        max_position_embeddings=int(gguf.field("context_length", 2048)),
        rope_parameters={"rope_type": "default", "rope_theta": float(gguf.field("rope.freq_base", 10000.0))},
        tie_word_embeddings="output.weight" not in gguf.tensors,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
    )
    if arch == "qwen2":
        kwargs["use_sliding_window"] = False
    return kwargs


def load_gguf_config(gguf: GGUFFile):
    """A transformers config (``Qwen2Config`` / ``LlamaConfig``) for the file."""
    from transformers import AutoConfig

    return AutoConfig.for_model(gguf.architecture, **config_kwargs(gguf))


def _unpermute(weight: Tensor, num_heads: int) -> Tensor:
    """Undo llama.cpp's q/k row permutation: rows [heads, d/2, 2] -> [heads, 2, d/2] (HF order)."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


class GGUFWeights(Mapping):
    """The file's tensors by HF name, each dequantized to fp32 when asked for (so a converter can
    hold one tensor at a time, not the whole model in fp32)."""

    def __init__(self, gguf: GGUFFile):
        self.gguf = gguf
        self._kwargs = config_kwargs(gguf)
        self._names = {hf_name(name): name for name in gguf.tensors}

    def __getitem__(self, name: str) -> Tensor:
        gguf_name = self._names[name]
        tensor = self.gguf.dequantize(gguf_name)
        if self.gguf.architecture == "llama" and gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = self._kwargs["num_attention_heads" if "attn_q" in gguf_name else "num_key_value_heads"]
            tensor = _unpermute(tensor, heads)
        return tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def read_gguf_weights(gguf: GGUFFile) -> dict[str, Tensor]:
    """Every tensor of the file, dequantized to fp32, by HF name."""
    return dict(GGUFWeights(gguf))
