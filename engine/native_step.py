"""The one-call decode step: our ``Transformer`` described to ``torch.classes.voxlane.NativeDecoder``
(engine/decode_step.cpp), which then runs a whole decode step, LM head included, in one C++ call.

Every weight mode maps onto it: the GGUF's own blocks (``NativeLinear``), our per-channel int8
(``Int8Linear``: format I8 with its row scales) and fp32 (``nn.Linear``). The pure-torch forward
(``Transformer.forward``) stays the readable reference it is tested against.
"""
from __future__ import annotations

import ctypes

import numpy as np
import torch
from torch import Tensor, nn

from engine import gguf_formats as fmt
from engine import kernels
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


def supports_model(model: Transformer) -> bool:
    """Whether the model can run the one-call step: kernels loaded, fp32 activations."""
    return (model.kernels is not None and model.norm.weight.dtype == torch.float32
            and hasattr(torch.classes.voxlane, "NativeDecoder"))


def supports(model: Transformer, cache: KVCacheTensors) -> bool:
    """Whether the model can run the one-call step over this cache (fp32 or fp16)."""
    return supports_model(model) and cache.k.dtype in (torch.float32, torch.float16)


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


class StepCalls:
    """A decoder's steps and ``expect_step`` as C calls through ctypes (decode_step.cpp's
    ``voxlane_greedy_rows``, ``voxlane_logits_rows`` and ``voxlane_expect_step``), for the engine's loop:
    after a step, a call of a custom-class method took 60-100 us here (its path out of cache), a ctypes
    call 10-17 us. A step's inputs and its argmax per logit row go through int64 buffers (one per decode
    batch size, kept): greedy steps return no logits; a sampled step's logit rows come back in a float
    buffer (``logits``)."""

    def __init__(self, decoder, vocab_size: int):
        library = ctypes.CDLL(str(kernels.library_path()))
        self.decoder = decoder  # kept alive: the calls take its address
        self.vocab_size = vocab_size
        self._address = decoder.address()
        self._rows_call = library.voxlane_greedy_rows
        self._rows_call.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                    ctypes.c_int64, ctypes.c_void_p]
        self._rows_call.restype = ctypes.c_char_p
        self._logits_call = library.voxlane_logits_rows
        self._logits_call.argtypes = self._rows_call.argtypes
        self._logits_call.restype = ctypes.c_char_p
        self._expect = library.voxlane_expect_step
        self._expect.argtypes = [ctypes.c_void_p, ctypes.c_int64]
        self._expect.restype = None
        self._decode: dict[int, tuple[np.ndarray, int]] = {}  # by batch size: [5, B] buffer, its address

    def step(self, token_ids: list[int], positions: list[int], slots: list[int]) -> list[int]:
        """``NativeDecoder.step`` of a decode batch (one row per sequence) -> each row's argmax."""
        B = len(slots)
        kept = self._decode.get(B)
        if kept is None:
            buffer = np.zeros((5, B), dtype=np.int64)  # tokens, positions, slots, logit rows, argmax
            buffer[3] = np.arange(B)
            kept = self._decode[B] = (buffer, buffer.ctypes.data)
        buffer, address = kept
        buffer[:3] = (token_ids, positions, slots)
        self._call(address, B, address + 3 * B * 8, B, address + 4 * B * 8)
        return buffer[4].tolist()

    def rows(self, token_ids: list[int], positions: list[int], slots: list[int], logit_rows: list[int]) -> list[int]:
        """``NativeDecoder.step`` of any rows (prompt chunks, and decode rows after them) -> the argmax of
        each of ``logit_rows`` (indices into the rows)."""
        T, L = len(token_ids), len(logit_rows)
        buffer, address = self._inputs(token_ids, positions, slots, logit_rows, L)  # then the argmax
        self._call(address, T, address + 3 * T * 8, L, address + (3 * T + L) * 8)
        return buffer[3 * T + L:].tolist()

    def logits(self, token_ids: list[int], positions: list[int], slots: list[int], logit_rows: list[int]) -> Tensor:
        """``NativeDecoder.step`` of any rows -> the logits [L, V] of ``logit_rows`` (a new float buffer the
        tensor owns: the sampler's rows may outlive the next step)."""
        T, L = len(token_ids), len(logit_rows)
        inputs, address = self._inputs(token_ids, positions, slots, logit_rows)  # kept alive through the call
        logits = np.empty((L, self.vocab_size), dtype=np.float32)
        self._call(address, T, address + 3 * T * 8, L, logits.ctypes.data, self._logits_call)
        return torch.from_numpy(logits)

    @staticmethod
    def _inputs(token_ids: list[int], positions: list[int], slots: list[int], logit_rows: list[int],
                extra: int = 0) -> tuple[np.ndarray, int]:
        """A step's int64 inputs in one new buffer: tokens, positions, slots [3, T], the logit rows, then
        ``extra`` words for the call's output -> (buffer, its address)."""
        T, L = len(token_ids), len(logit_rows)
        buffer = np.empty(3 * T + L + extra, dtype=np.int64)
        buffer[:3 * T] = token_ids + positions + slots
        buffer[3 * T:3 * T + L] = logit_rows
        return buffer, buffer.ctypes.data

    def _call(self, rows: int, T: int, logit_rows: int, L: int, out: int, call=None) -> None:
        error = (call or self._rows_call)(self._address, rows, T, logit_rows, L, out)
        if error is not None:
            raise RuntimeError(error.decode())

    def expect_step(self, us: int) -> None:
        """``NativeDecoder.expect_step``."""
        self._expect(self._address, us)
