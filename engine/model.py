"""One readable Llama-family decoder (Llama, SmolLM2, Qwen2/2.5, Mistral) in the style of
nanoGPT / gpt-fast: RMSNorm, RoPE, grouped-query attention over a preallocated KV cache, SwiGLU.

Shapes used in the comments:
  B  sequences in the forward pass       T  new tokens per sequence (1 when decoding)
  D  hidden size                         H  query heads, Hkv key/value heads, R = H // Hkv
  d  head dim                            L  cache positions attended (max position + 1 in the batch)
  V  vocabulary size

Two speed choices shape the code, both because at 135M parameters the cost per token is mostly
per-op overhead and weight reads, not arithmetic:
  * q/k/v are one fused ``qkv`` linear and gate/up one fused ``gate_up`` linear (fewer, bigger
    matmuls; RoPE is applied to q and k in one go since they are adjacent in the fused output).
  * grouped-query attention never repeats k/v: the R query heads that share a kv head are laid
    along the query-length axis, so one SDPA call reads each cached kv head once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class ModelArgs:
    """The architecture, read from an HF ``config.json`` (see ``engine.loader``)."""

    vocab_size: int
    dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    qkv_bias: bool = False  # Qwen2 (and Llama with attention_bias) have q/k/v biases
    o_bias: bool = False
    mlp_bias: bool = False
    tie_embeddings: bool = True
    sliding_window: int | None = None  # Mistral: a query at position i sees keys j > i - sliding_window

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads: {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")


def visible_keys(query_positions: Tensor, num_keys: int, sliding_window: int | None) -> Tensor:
    """Which keys each query may attend: query_positions [..., T] long -> bool [..., T, num_keys],
    True for key positions j <= i (causal) and, with a sliding window, j > i - window."""
    keys = torch.arange(num_keys, device=query_positions.device)
    i = query_positions.unsqueeze(-1)
    visible = keys <= i
    if sliding_window is not None:
        visible &= keys > i - sliding_window
    return visible


@dataclass
class AttentionBatch:
    """Where this forward pass reads and writes the KV cache; built once per step by the runner.

    ``slots`` [B] long and ``positions`` [B, T] long say where each new token's k/v is written.
    ``read_rows`` selects the cache rows attended: a slice (a view, no copy) when the batch's slots
    are consecutive and in order, else a LongTensor [B] (a gather). ``mask`` [B, 1, R*T, L] bool is
    True where a query may attend a key; None means "all L keys" (one decoding sequence).
    """

    slots: Tensor
    positions: Tensor
    read_rows: slice | Tensor
    kv_len: int
    mask: Tensor | None


@dataclass
class PackedBatch:
    """Several sequences' prefill chunks packed along T in one forward (B = 1, no padding).

    The linear layers run once over all the chunks' tokens (the weights are read once, not once
    per prompt); attention runs chunk by chunk, each with its own single-sequence ``AttentionBatch``,
    so a chunk reads only its own slot and no score is computed between chunks. ``lengths`` are the
    chunks' token counts in packing order (they sum to T).
    """

    chunks: list[AttentionBatch]
    lengths: list[int]


class KVCacheTensors(nn.Module):
    """The cache storage: k and v [num_layers, num_slots, Hkv, max_seq_len, d], written in place.

    Slot bookkeeping (who owns which slot, what tokens it holds) lives in ``engine.kv_cache``.
    ``torch.empty``: a fresh large allocation is untouched memory, so only the positions slots
    actually reach become resident (``KVCache.prepare_read`` zeroes what a batch reads unwritten).
    """

    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, max_seq_len: int, head_dim: int,
                 dtype: torch.dtype):
        super().__init__()
        shape = (num_layers, num_slots, num_kv_heads, max_seq_len, head_dim)
        self.register_buffer("k", torch.empty(shape, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.empty(shape, dtype=dtype), persistent=False)


def rope_tables(inv_freq: Tensor, max_seq_len: int, attention_factor: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and signed sin, each [max_seq_len, d], for the rotate-half RoPE convention of HF weights.

    The sign of rotate_half (-x2, x1) is folded into the first half of ``sin`` so applying RoPE is
    flip + multiply-add, with no negation or concatenation per step.
    """
    t = torch.arange(max_seq_len, dtype=torch.float32, device=inv_freq.device)
    freqs = torch.outer(t, inv_freq.float())  # [S, d/2]
    cos = torch.cat([freqs.cos(), freqs.cos()], dim=-1) * attention_factor
    sin = torch.cat([-freqs.sin(), freqs.sin()], dim=-1) * attention_factor
    return cos.to(dtype), sin.to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, T, heads, d]; cos, sin [B, T, 1, d]. x*cos + rotate_half(x)*sin."""
    half = x.shape[-1] // 2
    swapped = x.unflatten(-1, (2, half)).flip(-2).flatten(-2)  # (x2, x1); the minus sign is in sin
    return torch.addcmul(x * cos, swapped, sin)


class Attention(nn.Module):
    """Grouped-query self-attention with a fused qkv projection, reading/writing the KV cache."""

    def __init__(self, args: ModelArgs, layer_index: int):
        super().__init__()
        self.layer_index = layer_index
        self.sliding_window = args.sliding_window
        self.num_heads, self.num_kv_heads, self.head_dim = args.num_heads, args.num_kv_heads, args.head_dim
        self.q_size = args.num_heads * args.head_dim
        self.kv_size = args.num_kv_heads * args.head_dim
        self.qkv = nn.Linear(args.dim, self.q_size + 2 * self.kv_size, bias=args.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, args.dim, bias=args.o_bias)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCacheTensors | None,
                batch: AttentionBatch | PackedBatch | None) -> Tensor:
        B, T, _ = x.shape
        H, Hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        R = H // Hkv
        qkv = self.qkv(x)  # [B, T, (H + 2*Hkv) * d]
        # RoPE on q and k at once: they are the first H + Hkv heads of the fused output.
        qk = apply_rope(qkv[..., : self.q_size + self.kv_size].unflatten(-1, (H + Hkv, d)), cos, sin)
        q, k = qk[:, :, :H], qk[:, :, H:]  # [B, T, H, d], [B, T, Hkv, d]
        v = qkv[..., self.q_size + self.kv_size:].unflatten(-1, (Hkv, d))  # [B, T, Hkv, d]

        if cache is None:  # no cache (the benchmark's baseline): plain causal attention over T
            q = q.transpose(1, 2)
            k = k.transpose(1, 2).repeat_interleave(R, dim=1)
            v = v.transpose(1, 2).repeat_interleave(R, dim=1)
            if self.sliding_window is None:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, d]
            else:
                mask = visible_keys(torch.arange(T, device=x.device), T, self.sliding_window)  # [T, T]
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return self.o_proj(y.transpose(1, 2).reshape(B, T, H * d))

        if isinstance(batch, PackedBatch):
            parts = zip(q.split(batch.lengths, 1), k.split(batch.lengths, 1), v.split(batch.lengths, 1), batch.chunks)
            y = torch.cat([self._attend_cached(*part, cache) for part in parts], dim=1)  # [1, T, H*d]
        else:
            y = self._attend_cached(q, k, v, batch, cache)
        return self.o_proj(y)

    def _attend_cached(self, q: Tensor, k: Tensor, v: Tensor, batch: AttentionBatch, cache: KVCacheTensors) -> Tensor:
        """Write k, v [B, T, Hkv, d] into the cache, attend q [B, T, H, d] over the cached keys
        -> [B, T, H*d]."""
        B, T, H, d = q.shape
        Hkv = self.num_kv_heads
        R = H // Hkv
        k_cache, v_cache = cache.k[self.layer_index], cache.v[self.layer_index]  # [slots, Hkv, S, d]
        # Write the new k/v at (slot, :, position): advanced indices around a slice put the
        # indexed dims first, so the destination is [B, T, Hkv, d], exactly k's layout. A cache of
        # another dtype than the activations (fp16: EngineConfig.kv_cache_dtype) stores them rounded to
        # it and is read back in the activations' dtype.
        k_cache[batch.slots[:, None], :, batch.positions] = k.to(k_cache.dtype)
        v_cache[batch.slots[:, None], :, batch.positions] = v.to(v_cache.dtype)
        keys = k_cache[batch.read_rows, :, : batch.kv_len].to(q.dtype)  # [B, Hkv, L, d]
        values = v_cache[batch.read_rows, :, : batch.kv_len].to(q.dtype)
        # The R query heads sharing a kv head go along the query axis: [B, Hkv, R*T, d]
        # (HF's head order: query head h uses kv head h // R).
        q = q.unflatten(2, (Hkv, R)).permute(0, 2, 3, 1, 4).reshape(B, Hkv, R * T, d)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=batch.mask)  # [B, Hkv, R*T, d]
        return y.unflatten(2, (R, T)).permute(0, 3, 1, 2, 4).reshape(B, T, H * d)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), with gate and up fused in one matmul."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.intermediate_size = args.intermediate_size
        self.gate_up = nn.Linear(args.dim, 2 * args.intermediate_size, bias=args.mlp_bias)
        self.down_proj = nn.Linear(args.intermediate_size, args.dim, bias=args.mlp_bias)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).split(self.intermediate_size, dim=-1)  # [B, T, I] each
        return self.down_proj(F.silu(gate) * up)


class RMSNorm(nn.Module):
    """x / rms(x) * weight.

    Written out rather than ``F.rms_norm``: on CPU that is a composite of ~10 small kernels
    (counted with the profiler), this is 5, and at batch 1 each kernel launch costs about as much
    as the arithmetic.
    """

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True).add_(self.eps)) * self.weight


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, args: ModelArgs, layer_index: int):
        super().__init__()
        self.input_norm = RMSNorm(args.dim, args.norm_eps)
        self.attn = Attention(args, layer_index)
        self.post_attn_norm = RMSNorm(args.dim, args.norm_eps)
        self.mlp = MLP(args)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCacheTensors | None,
                batch: AttentionBatch | PackedBatch | None) -> Tensor:
        x = x + self.attn(self.input_norm(x), cos, sin, cache, batch)
        return x + self.mlp(self.post_attn_norm(x))


class Transformer(nn.Module):
    """The decoder. ``forward`` returns final-normed hidden states; ``logits`` applies the LM head,
    so a prefill computes the (large, V x D) head only for the positions it samples from."""

    def __init__(self, args: ModelArgs, inv_freq: Tensor, attention_factor: float = 1.0,
                 max_seq_len: int | None = None):
        super().__init__()
        self.args = args
        self.embed = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args, i) for i in range(args.num_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.lm_head = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.max_seq_len = max_seq_len or args.max_position_embeddings
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self.attention_factor = attention_factor
        self.kernels = None  # torch.ops.voxlane (engine.kernels) when loaded: the one-call decode step
        # The one-call step quantizes the inputs of GGUF-format weights to Q8 blocks (engine/q8_matmul.h);
        # the per-op and pure-torch paths keep fp32 activations whatever this says.
        self.int8_activations = False
        # The one-call step rounds the inputs of Q4_0 / Q5_0 / Q4_1 weights to bf16 in prompt chunks (AMX
        # tiles, engine/prefill_gemm.h); likewise only there.
        self.bf16_activations = False
        # The one-call step's decoding batches multiply Q4_0 / Q4_1 / Q8_0 weights with int16 activations
        # (engine/r16_matmul.h); likewise only there.
        self.int16_activations = False
        self.set_rope_dtype(torch.float32)

    def set_rope_dtype(self, dtype: torch.dtype) -> None:
        """(Re)build the RoPE tables in the activation dtype."""
        cos, sin = rope_tables(self.inv_freq, self.max_seq_len, self.attention_factor, dtype)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens: Tensor, positions: Tensor, cache: KVCacheTensors | None = None,
                batch: AttentionBatch | PackedBatch | None = None) -> Tensor:
        """tokens, positions [B, T] long -> hidden [B, T, D] (after the final norm)."""
        x = self.embed(tokens)  # [B, T, D]
        cos = self.rope_cos[positions].unsqueeze(2)  # [B, T, 1, d]
        sin = self.rope_sin[positions].unsqueeze(2)
        for layer in self.layers:
            x = layer(x, cos, sin, cache, batch)
        return self.norm(x)

    def logits(self, hidden: Tensor) -> Tensor:
        """hidden [..., D] -> logits [..., V] in float32 (sampling wants full precision)."""
        return self.lm_head(hidden).float()
