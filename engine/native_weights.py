"""Run a GGUF's quantized weights as they are stored (``EngineConfig(quant="native")``).

The packaged models are already quantized (SmolLM2: Q4_1 blocks and a Q8_0 embedding; Qwen2.5:
Q5_0, Q8_0, Q4_K, Q6_K). Dequantizing them and requantizing to per-channel int8 read ~1.8x the
bytes and was less exact than the file; here every linear layer keeps the file's raw blocks and
multiplies by them directly (``torch.ops.voxlane.quant_linear``, engine/quant_ops.cpp), with fp32
activations and accumulation: logits equal the dequantized file's within float rounding.

Our layout fuses q/k/v and gate/up; a fused layer is a list of row segments (``QuantWeight``s),
one per format run (Qwen2.5-0.5B's v is Q8_0 in half the layers, its q and k Q5_0).
"""
from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine import gguf_formats as fmt
from engine.model import Transformer


# The 16-row interleaved layout of int16 activations (engine/r16_matmul.h), per format: 64-byte lines
# per 32-weight block, fp16 scale fields per block (d, and Q4_1's m), and whether the bytes are q + 128.
R16_GEOMETRY = {fmt.Q4_0: (4, 1, False), fmt.Q4_1: (4, 2, False), fmt.Q8_0: (8, 1, True)}


def unpack_r16(blocks: Tensor, format: int, cols: int) -> Tensor:
    """R16 rows [N, row_bytes] (N % 16 == 0) -> the file's blocks (a new tensor): per group of 16 rows,
    block b's lines j hold each row's bytes 4j..4j+3 of its quants (line-major: [block, line, row, 4]),
    then the scales [block, field, row, 2]; a file block is its scale fields, then its quants."""
    lines, fields, offset = R16_GEOMETRY[format]
    rows, row_bytes = blocks.shape
    groups, nb = rows // 16, cols // 32
    g = blocks.reshape(groups, 16 * row_bytes)
    split = nb * lines * 64
    qs = g[:, :split].reshape(groups, nb, lines, 16, 4).permute(0, 3, 1, 2, 4).reshape(groups, 16, nb, lines * 4)
    if offset:
        qs = qs ^ 0x80
    scales = g[:, split:].reshape(groups, nb, fields, 16, 2).permute(0, 3, 1, 2, 4).reshape(groups, 16, nb, 2 * fields)
    return torch.cat([scales, qs], -1).reshape(rows, row_bytes)


@dataclass
class QuantWeight:
    """One matrix's rows in a weight format: ``blocks`` uint8 [rows, row_bytes] as the file stores
    them (``gguf_formats``), or with ``r16`` in the 16-row interleaved layout of int16 activations
    (``pack_r16``; the same bytes, reordered); ``row_scale`` only for our I8 format."""

    format: int
    blocks: Tensor
    cols: int
    row_scale: Tensor | None = None
    r16: bool = False

    @property
    def rows(self) -> int:
        return self.blocks.shape[0]

    def file_blocks(self) -> Tensor:
        """The blocks in the file's layout (a copy when they are packed in R16)."""
        return unpack_r16(self.blocks, self.format, self.cols) if self.r16 else self.blocks

    def dequantize(self) -> Tensor:
        return fmt.dequantize(self.file_blocks(), self.format, self.cols, self.row_scale)


def concat_rows(parts: list[QuantWeight]) -> list[QuantWeight]:
    """Adjacent segments of one format joined into one (rows of blocks stack as they are)."""
    out: list[QuantWeight] = []
    for part in parts:
        if (out and out[-1].format == part.format and out[-1].row_scale is None and part.row_scale is None
                and not out[-1].r16 and not part.r16):
            out[-1] = QuantWeight(part.format, torch.cat([out[-1].blocks, part.blocks]), part.cols)
        else:
            out.append(part)
    return out


class NativeLinear(nn.Module):
    """y = x @ W.T + b with W stored in its file's block format, as row segments (``parts``).

    With the kernels: ``quant_linear`` per segment (fp32 in, fp32 accumulate, fp32 out). Without
    (no compiler): the pure-torch twin, dequantize then ``F.linear`` (slow; same values).
    """

    def __init__(self, parts: list[QuantWeight], bias: Tensor | None, kernels=None):
        super().__init__()
        self.parts = concat_rows(parts)
        self.in_features = self.parts[0].cols
        self.out_features = sum(p.rows for p in self.parts)
        self.kernels = kernels
        for i, part in enumerate(self.parts):  # buffers, so weight_bytes() and .to() see them
            self.register_buffer(f"blocks_{i}", part.blocks)
        self.register_buffer("bias", None if bias is None else bias.float().contiguous())

    def forward(self, x: Tensor) -> Tensor:
        x2 = x.reshape(-1, self.in_features).float().contiguous()
        if self.kernels is not None:
            ys = [self.kernels.quant_linear(x2, p.file_blocks(), p.format, p.cols, p.row_scale, None)
                  for p in self.parts]
            y = ys[0] if len(ys) == 1 else torch.cat(ys, dim=-1)
            if self.bias is not None:
                y += self.bias
        else:
            y = F.linear(x2, self.dequantize(), self.bias)
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)

    def dequantize(self) -> Tensor:
        """The whole weight in fp32 [N, K] (the reference the kernels are tested against)."""
        return torch.cat([p.dequantize() for p in self.parts])


class NativeEmbedding(nn.Module):
    """Token embedding read from quantized rows (shared with a tied ``NativeLinear`` head)."""

    def __init__(self, weight: QuantWeight, kernels=None):
        super().__init__()
        self.weight_q = weight
        self.kernels = kernels
        self.register_buffer("blocks", weight.blocks)  # counted once with a tied head (same storage)

    def forward(self, ids: Tensor) -> Tensor:
        w, flat = self.weight_q, ids.reshape(-1)
        if self.kernels is not None:
            rows = self.kernels.quant_embedding(w.file_blocks(), w.format, w.cols, w.row_scale, flat.contiguous())
        else:
            rows = fmt.dequantize(w.file_blocks()[flat], w.format, w.cols,
                                  None if w.row_scale is None else w.row_scale[flat])
        return rows.view(*ids.shape, w.cols)


def pack_r16(model: Transformer, kernels) -> int:
    """Int16 activations (``EngineConfig.int16_activations``): every Q4_0 / Q4_1 / Q8_0 matrix of the
    model whose rows come in groups of 16 rewritten in place in the R16 layout (engine/r16_matmul.h), so
    the one-call step streams one copy of the weights (it unpacks rows where it needs the file's blocks:
    prompt chunks, the embedding lookup); the per-op and pure-torch paths unpack them (slowly). Once per
    model; returns the bytes packed now."""
    packed, seen = 0, set()
    for module in model.modules():
        parts = module.parts if isinstance(module, NativeLinear) else \
            [module.weight_q] if isinstance(module, NativeEmbedding) else []
        for part in parts:
            if id(part) in seen or part.r16 or part.format not in R16_GEOMETRY or part.rows % 16:
                continue
            seen.add(id(part))
            kernels.quant_r16_pack_(part.blocks, part.format, part.cols)
            part.r16 = True
            packed += part.blocks.numel()
    return packed


def _unpermute_rows(blocks: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order for the ``llama`` architecture (its RoPE pairs adjacent
    elements; HF's, and ours, the two halves): rows [heads, d/2, 2] -> [heads, 2, d/2]. A row
    permutation, so the blocks move as they are."""
    rows = blocks.shape[0]
    return blocks.reshape(num_heads, rows // num_heads // 2, 2, -1).transpose(0, 2, 1, 3).reshape(rows, -1)


class BlockArena:
    """One anonymous memory mapping that a file's weight blocks are copied into, asked for as
    transparent huge pages (``madvise(MADV_HUGEPAGE)``, 2 MB pages where the kernel allows it).

    Why: a decode step streams every block once (Qwen2.5-0.5B: ~370 MB per token), and with 4 KB
    pages that is ~90,000 TLB misses per step and prefetches that stop at each page's end. Measured
    with the int8-activation kernels on Qwen's blocks (1 thread, batch 1, load ~2): 56-59 -> 52-53 ms
    per pass over the matrices; a plain read of them 88 -> 57 ms (load ~10). Pages are made resident
    only when written, so reserving the whole file's size costs no memory.

    The mapping is private (MAP_PRIVATE | MAP_ANONYMOUS). Python's ``mmap.mmap(-1, n)`` alone maps
    MAP_SHARED, which Linux backs with shmem, whose huge pages follow
    /sys/kernel/mm/transparent_hugepage/shmem_enabled (``never`` by default), not the madvise: until the
    fourteenth session the weights were on 4 KB pages wherever shmem_enabled was ``never`` (this VM:
    SmolLM2's 94 MB arena, AnonHugePages 0; private: 94 MB of 2 MB pages). PRIVATE = False maps it
    shared again (A/B measurements)."""

    HUGE_PAGE = 2 << 20
    PRIVATE = True

    def __init__(self, capacity: int):
        if self.PRIVATE and hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS"):
            self._map = mmap.mmap(-1, capacity + self.HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        else:
            self._map = mmap.mmap(-1, capacity + self.HUGE_PAGE)  # MAP_SHARED: shmem
        if hasattr(mmap, "MADV_HUGEPAGE"):  # Linux; elsewhere plain pages
            try:
                self._map.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                pass
        base = np.frombuffer(self._map, dtype=np.uint8, count=1).ctypes.data
        self._offset = -base % self.HUGE_PAGE  # the first block starts on a huge page
        self._end = len(self._map)

    def copy_rows(self, arrays: list[np.ndarray]) -> Tensor:
        """The rows of ``arrays`` (uint8 [rows_i, width], any strides) stacked, copied into the
        arena (64-byte aligned): [sum rows_i, width]."""
        nbytes = sum(a.nbytes for a in arrays)
        start = (self._offset + 63) // 64 * 64
        if start + nbytes > self._end:
            raise ValueError("BlockArena: full (its capacity is the file's quantized tensors)")
        out = np.frombuffer(self._map, dtype=np.uint8, count=nbytes, offset=start).reshape(-1, arrays[0].shape[1])
        row = 0
        for a in arrays:
            np.copyto(out[row: row + a.shape[0]], a)
            row += a.shape[0]
        self._offset = start + nbytes
        return torch.from_numpy(out)  # keeps the mapping alive through the array


class GGUFTensors:
    """A GGUF's tensors as ``QuantWeight`` (quantized matrices, copied into a ``BlockArena``) or fp32
    (norms, biases), each copied out of the file's memory map (so the file can be closed and only
    what is used stays resident)."""

    def __init__(self, path: Path):
        from engine.gguf_file import GGUFFile

        self.file = GGUFFile(path)
        self.architecture = self.file.architecture
        self.tensors = self.file.tensors
        self._arena: BlockArena | None = None  # made at the first quant(): room for every block of the file

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def formats(self) -> set[int]:
        return {t.ggml_type for t in self.tensors.values()}

    def quant(self, name: str, unpermute_heads: int = 0) -> QuantWeight:
        return self.quant_rows([name], [unpermute_heads])[0]

    def quant_rows(self, names: list[str], unpermute_heads: list[int] | None = None) -> list[QuantWeight]:
        """The matrices ``names`` stacked by rows (a fused layer: q | k | v, gate | up), one
        ``QuantWeight`` per run of one format, each copied once into the arena."""
        runs: list[tuple[int, int, list[np.ndarray]]] = []  # (format, cols, raw rows)
        for name, heads in zip(names, unpermute_heads or [0] * len(names)):
            info = self.tensors[name]
            rows, cols = info.shape  # torch order
            raw = self.file.raw(name).reshape(rows, -1)
            if heads:
                raw = _unpermute_rows(raw, heads)
            if runs and runs[-1][:2] == (info.ggml_type, cols):
                runs[-1][2].append(raw)
            else:
                runs.append((info.ggml_type, cols, [raw]))
        if self._arena is None:
            self._arena = BlockArena(sum(t.nbytes + 64 for t in self.tensors.values() if t.ggml_type != fmt.F32))
        return [QuantWeight(format, self._arena.copy_rows(raws), cols) for format, cols, raws in runs]

    def vector(self, name: str) -> Tensor:
        if self.tensors[name].ggml_type != fmt.F32:
            raise NotImplementedError(f"{name}: a quantized vector")
        return self.file.dequantize(name).float().reshape(-1).contiguous()


def load_native_weights(model: Transformer, gguf_path: Path, kernels=None) -> Transformer:
    """Fill a ``Transformer`` built on the meta device with a GGUF's weights as stored: norms and
    biases fp32, every matrix a ``NativeLinear`` (the tied head shares the embedding's blocks)."""
    args = model.args
    tensors = GGUFTensors(gguf_path)
    llama = tensors.architecture == "llama"
    for format in tensors.formats():
        if format not in fmt.GEOMETRY or format == fmt.I8:
            raise NotImplementedError(f"{gguf_path.name}: weight format {format} is not supported by the native "
                                      f"kernels ({', '.join(fmt.NAMES[f] for f in fmt.GEOMETRY if f != fmt.I8)})")
    for i, block in enumerate(model.layers):
        name = f"blk.{i}."
        block.input_norm.weight = nn.Parameter(tensors.vector(name + "attn_norm.weight"), requires_grad=False)
        block.post_attn_norm.weight = nn.Parameter(tensors.vector(name + "ffn_norm.weight"), requires_grad=False)
        qkv = tensors.quant_rows([name + "attn_q.weight", name + "attn_k.weight", name + "attn_v.weight"],
                                 [args.num_heads, args.num_kv_heads, 0] if llama else None)
        bias = None
        if args.qkv_bias:
            bias = torch.cat([tensors.vector(name + f"attn_{p}.bias") for p in "qkv"])
        block.attn.qkv = NativeLinear(qkv, bias, kernels)
        block.attn.o_proj = NativeLinear([tensors.quant(name + "attn_output.weight")], None, kernels)
        block.mlp.gate_up = NativeLinear(tensors.quant_rows([name + "ffn_gate.weight", name + "ffn_up.weight"]), None,
                                         kernels)
        block.mlp.down_proj = NativeLinear([tensors.quant(name + "ffn_down.weight")], None, kernels)
    model.norm.weight = nn.Parameter(tensors.vector("output_norm.weight"), requires_grad=False)
    embedding = tensors.quant("token_embd.weight")
    model.embed = NativeEmbedding(embedding, kernels)
    head = embedding if "output.weight" not in tensors else tensors.quant("output.weight")
    model.lm_head = NativeLinear([head], None, kernels)
    del tensors  # closes the memory map: only the copies above stay resident
    return model


def native_gguf_path(model_path: str | Path) -> Path:
    """The GGUF whose blocks ``quant="native"`` runs: the path itself, or a directory's ``model.gguf``."""
    from engine.loader import GGUF_FILE_NAME

    path = Path(model_path)
    if path.suffix == ".gguf" and path.is_file():
        return path
    if (path / GGUF_FILE_NAME).is_file():  # the file, or (SmolLM2) a link to the packaged one
        return path / GGUF_FILE_NAME
    raise FileNotFoundError(f"quant='native' runs a GGUF's own blocks, and {path} has no {GGUF_FILE_NAME}: "
                            f"use quant='int8' for models that do not come as GGUF")


def load_native_model(model_path: str | Path, max_seq_len: int | None = None, kernels=None) -> Transformer:
    """Our ``Transformer`` (fp32 activations) with a GGUF's quantized weights as they are stored."""
    from engine.loader import load_config, model_args_from_config
    from engine.rope import rope_frequencies

    gguf_path = native_gguf_path(model_path)
    config = load_config(model_path)
    args = model_args_from_config(config)
    if args.o_bias or args.mlp_bias:
        raise NotImplementedError("quant='native': o_proj / MLP biases are not read from GGUF files")
    if max_seq_len is not None:
        max_seq_len = min(max_seq_len, args.max_position_embeddings)
    inv_freq, attention_factor = rope_frequencies(config, args.head_dim)
    with torch.device("meta"):  # every weight comes from the file
        model = Transformer(args, inv_freq, attention_factor, max_seq_len)
    model.inv_freq = inv_freq.float()
    model.kernels = kernels
    load_native_weights(model, gguf_path, kernels)
    model.set_rope_dtype(torch.float32)
    return model.eval().requires_grad_(False)
