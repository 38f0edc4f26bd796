"""``ModelRunner``: turns a step plan into model forwards (packed prefill chunks, batched decode).

It owns the model and the cache tensors and builds each forward's ``AttentionBatch``: where the new
k/v go, which cache rows are read, and the boolean mask (only what differing lengths need). With the
kernels (engine/kernels.py) and fp32 activations, a decode batch is one native call instead
(``engine.native_step``: the whole layer stack and the LM head in C++), which needs none of that:
each sequence reads exactly its own length.
"""
from __future__ import annotations

import torch
from torch import Tensor

from engine import native_step
from engine.kv_cache import KVCache
from engine.model import AttentionBatch, PackedBatch, Transformer, visible_keys


class ModelRunner:
    """Runs prefill chunks and decode batches of our ``Transformer`` against a ``KVCache``."""

    def __init__(self, model: Transformer, kv_cache: KVCache, compile: bool = False):
        self.model = model
        self.kv_cache = kv_cache
        # The one-call decode step needs the model's kernels (torch.ops.voxlane) and fp32 activations.
        self.fused_decode = native_step.supports(model, kv_cache.tensors)
        self.decoder = native_step.build_decoder(model, kv_cache.tensors) if self.fused_decode else None
        self.group = model.args.num_heads // model.args.num_kv_heads  # R query heads per kv head
        self._decode_forward = model.forward
        if compile:
            # dynamic=True: batch size and cache length change every step; one graph for all.
            self._decode_forward = torch.compile(model.forward, dynamic=True)

    def _prefill_batch(self, slot: int, start: int, T: int) -> AttentionBatch:
        """Where a chunk of T prompt tokens at positions start.. of ``slot`` writes and reads."""
        L = start + T
        positions = torch.arange(start, L).unsqueeze(0)  # [1, T]
        # Causal with an offset: query i (position start+i) sees keys 0..start+i (within the sliding
        # window, if any). Rows repeat per query head of a group because q is laid out [Hkv, R*T, d].
        mask = visible_keys(positions[0], L, self.model.args.sliding_window)  # [T, L]
        return AttentionBatch(slots=torch.tensor([slot]), positions=positions, read_rows=slice(slot, slot + 1),
                              kv_len=L, mask=mask.repeat(self.group, 1)[None, None])  # mask [1, 1, R*T, L]

    @torch.inference_mode()
    def prefill(self, slot: int, token_ids: list[int], start: int, want_logits: bool = True) -> Tensor | None:
        """Write k/v for ``token_ids`` at positions start.. of ``slot``; logits [V] of the last one."""
        return self.prefill_many([(slot, token_ids, start, want_logits)])[0]

    @torch.inference_mode()
    def prefill_many(self, chunks: list[tuple[int, list[int], int, bool]]) -> list[Tensor | None]:
        """Several sequences' prompt chunks (slot, token ids, start, want_logits) in one forward ->
        logits [V] of each chunk's last token (None where not wanted).

        Why one forward: prompts that arrive together were prefilled one per step, each forward
        reading all the weights for a few rows. Packed along the token axis (``PackedBatch``), the
        linear layers read them once; attention still runs per chunk, over its own slot only.
        """
        if self.fused_decode:
            return self.prefill_and_decode(chunks, [], [], [])[0]
        batches = [self._prefill_batch(slot, start, len(ids)) for slot, ids, start, _ in chunks]
        lengths = [len(ids) for _, ids, _, _ in chunks]
        batch = batches[0] if len(chunks) == 1 else PackedBatch(batches, lengths)
        tokens = torch.tensor([[t for _, ids, _, _ in chunks for t in ids]])  # [1, T]
        positions = torch.cat([b.positions for b in batches], dim=1)  # [1, T]
        hidden = self.model(tokens, positions, self.kv_cache.tensors, batch)  # [1, T, D]
        for slot, ids, start, _ in chunks:
            self.kv_cache.note_written(slot, start + len(ids))
        ends = torch.tensor(lengths).cumsum(0) - 1  # each chunk's last token on the packed axis
        wanted = [i for i, chunk in enumerate(chunks) if chunk[3]]
        logits = self.model.logits(hidden[0, ends[wanted]]) if wanted else None  # [n, V]
        out: list[Tensor | None] = [None] * len(chunks)
        for row, i in enumerate(wanted):
            out[i] = logits[row]
        return out

    @torch.inference_mode()
    def prefill_and_decode(self, chunks: list[tuple[int, list[int], int, bool]], slots: list[int],
                           token_ids: list[int], positions: list[int]) -> tuple[list[Tensor | None], Tensor]:
        """Prompt chunks (as ``prefill_many``) and a decode batch (as ``decode``) in ONE native call,
        so a prompt arriving while others decode costs no extra pass over the weights: every token is
        a row with its own slot and position (a chunk's rows attend each other causally through the
        cache). -> (each chunk's last-token logits or None, the decode rows' logits [B, V])."""
        tokens = [t for _, ids, _, _ in chunks for t in ids] + list(token_ids)
        rows_positions = [start + i for _, ids, start, _ in chunks for i in range(len(ids))] + list(positions)
        rows_slots = [slot for slot, ids, _, _ in chunks for _ in ids] + list(slots)
        ends = torch.tensor([len(ids) for _, ids, _, _ in chunks], dtype=torch.long).cumsum(0) - 1
        wanted = [i for i, chunk in enumerate(chunks) if chunk[3]]
        prompt_rows = sum(len(ids) for _, ids, _, _ in chunks)
        logit_rows = torch.cat([ends[wanted], torch.arange(prompt_rows, prompt_rows + len(slots))])
        logits = self.decoder.step(torch.tensor(tokens), torch.tensor(rows_positions), torch.tensor(rows_slots),
                                   logit_rows)
        for slot, ids, start, _ in chunks:
            self.kv_cache.note_written(slot, start + len(ids))
        for slot, position in zip(slots, positions):
            self.kv_cache.note_written(slot, position + 1)
        out: list[Tensor | None] = [None] * len(chunks)
        for row, i in enumerate(wanted):
            out[i] = logits[row]
        return out, logits[len(wanted):]

    @torch.inference_mode()
    def decode(self, slots: list[int], token_ids: list[int], positions: list[int]) -> Tensor:
        """One new token per sequence (slots sorted ascending) -> logits [B, V]."""
        if self.fused_decode:
            return self.prefill_and_decode([], slots, token_ids, positions)[1]
        B = len(slots)
        pos = torch.tensor(positions).unsqueeze(1)  # [B, 1]
        L = max(positions) + 1
        if slots[-1] - slots[0] + 1 == B:
            rows: slice | Tensor = slice(slots[0], slots[-1] + 1)  # consecutive slots: a view
        else:
            rows = torch.tensor(slots)  # holes between slots: gather (copies the rows read)
        window = self.model.args.sliding_window
        if min(positions) == L - 1 and (window is None or window >= L):
            mask = None  # every sequence attends all L keys
        else:
            mask = visible_keys(pos, L, window)[:, None]  # [B, 1, 1, L]
            self.kv_cache.prepare_read(slots, positions, L)
        batch = AttentionBatch(slots=torch.tensor(slots), positions=pos, read_rows=rows, kv_len=L, mask=mask)
        hidden = self._decode_forward(torch.tensor(token_ids).unsqueeze(1), pos, self.kv_cache.tensors, batch)
        for slot, position in zip(slots, positions):
            self.kv_cache.note_written(slot, position + 1)
        return self.model.logits(hidden[:, 0])
