"""KV-cache slots: preallocated storage plus who owns each slot and which tokens it holds.

A conversation (``session``) keeps its slot between turns, remembering the token ids whose k/v
the slot holds. A new turn reuses the longest common prefix of those ids and its new prompt, so
only the new tokens are prefilled. When the history was trimmed or edited the common prefix is
shorter and the rest is recomputed; when the slot was reclaimed for someone else it is empty and
the turn falls back to a full prefill. Either way the result equals a full prefill.

Shared prefixes: a prompt start many conversations have in common (a persona's system prompt) is
prefilled once into a row of its own, read-only, past the sessions' slots. A slot that would
otherwise recompute those tokens copies their k/v from that row instead (a few MB, microseconds
against a prefill of tens of milliseconds), so no session ever recomputes a shared prefix.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from engine.model import KVCacheTensors, ModelArgs


@dataclass
class Slot:
    """One row of the cache. ``tokens`` are the ids whose k/v sit at positions 0..len-1."""

    index: int
    session: str | None = None
    tokens: list[int] = field(default_factory=list)
    is_busy: bool = False  # a running sequence writes it
    last_used: int = 0


@dataclass
class SharedPrefix:
    """A read-only prompt start in cache row ``row``, whose k/v every slot may copy."""

    row: int
    tokens: tuple[int, ...]
    is_ready: bool = False  # its k/v have been computed
    last_used: int = 0
    num_copies: int = 0  # slots it was copied into (instead of being recomputed)


def common_prefix_length(a, b) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class KVCache:
    """Preallocated per-slot KV cache (``tensors``, written in place by the model) and its slots."""

    def __init__(self, args: ModelArgs, num_slots: int, max_seq_len: int, dtype: torch.dtype,
                 num_shared_prefixes: int = 0):
        self.max_seq_len = max_seq_len
        rows = num_slots + num_shared_prefixes  # shared prefixes live in rows past the slots
        self.tensors = KVCacheTensors(args.num_layers, rows, args.num_kv_heads, max_seq_len, args.head_dim, dtype)
        self.slots = [Slot(i) for i in range(num_slots)]
        self._free_prefix_rows = list(range(num_slots, rows))
        self.prefixes: dict[tuple[int, ...], SharedPrefix] = {}
        # Leading positions of each slot that hold finite values (written or zeroed). The storage
        # starts uninitialized (see KVCacheTensors) and may hold NaN bit patterns.
        self._initialized = [0] * rows
        self._by_session: dict[str, Slot] = {}
        self._clock = itertools.count(1)

    def acquire(self, session: str | None, prompt_ids: list[int], max_reused: int | None = None) -> tuple[int, int] | None:
        """Claim a slot for a sequence: (slot index, number of prompt tokens already cached), or
        None when no slot can be had now (all busy, or this session's slot is still busy). At most
        ``max_reused`` tokens are taken from the cache (the rest is recomputed)."""
        slot = self._by_session.get(session) if session is not None else None
        if slot is not None and slot.is_busy:
            return None  # the session's previous turn has not released it yet (e.g. cancel pending)
        if slot is None:
            slot = self._free_slot()
            if slot is None:
                return None
            if slot.session is not None:  # reclaiming an idle conversation: it will prefill fully later
                del self._by_session[slot.session]
            slot.session, slot.tokens = session, []
            if session is not None:
                self._by_session[session] = slot
        # At least the last prompt token is recomputed: its logits pick the first new token.
        limit = len(prompt_ids) - 1 if max_reused is None else max(0, min(max_reused, len(prompt_ids) - 1))
        reused = min(common_prefix_length(slot.tokens, prompt_ids), limit)
        slot.tokens = slot.tokens[:reused]
        reused = self._copy_shared_prefix(slot, prompt_ids, reused, limit)
        slot.is_busy = True
        slot.last_used = next(self._clock)
        return slot.index, reused

    # ---- shared prefixes ----
    def reserve_prefix(self, tokens: list[int]) -> SharedPrefix | None:
        """The shared prefix holding ``tokens``: the existing one, or a new row (the least recently
        used ready prefix is evicted when all rows are taken) that the caller must fill and then
        ``mark_prefix_ready``. None when there are no prefix rows or ``tokens`` do not fit."""
        key = tuple(tokens)
        if key in self.prefixes:
            return self.prefixes[key]
        if not tokens or len(tokens) >= self.max_seq_len:
            return None
        if not self._free_prefix_rows:
            ready = [p for p in self.prefixes.values() if p.is_ready]
            if not ready:
                return None
            oldest = min(ready, key=lambda p: p.last_used)
            del self.prefixes[oldest.tokens]
            self._free_prefix_rows.append(oldest.row)
        prefix = SharedPrefix(self._free_prefix_rows.pop(), key, last_used=next(self._clock))
        self.prefixes[key] = prefix
        return prefix

    def mark_prefix_ready(self, prefix: SharedPrefix) -> None:
        prefix.is_ready = True
        self.note_written(prefix.row, len(prefix.tokens))

    def _copy_shared_prefix(self, slot: Slot, prompt_ids: list[int], reused: int, limit: int) -> int:
        """Copy the k/v of the shared prefix that covers most of ``prompt_ids`` beyond the ``reused``
        tokens the slot already holds; returns the tokens now cached."""
        best, best_length = None, reused
        for prefix in self.prefixes.values():
            if prefix.is_ready:
                length = min(common_prefix_length(prefix.tokens, prompt_ids), limit)
                if length > best_length:
                    best, best_length = prefix, length
        if best is None:
            return reused
        k, v = self.tensors.k, self.tensors.v  # [layers, rows, Hkv, S, d]
        k[:, slot.index, :, reused:best_length] = k[:, best.row, :, reused:best_length]
        v[:, slot.index, :, reused:best_length] = v[:, best.row, :, reused:best_length]
        self.note_written(slot.index, best_length)
        slot.tokens = list(prompt_ids[:best_length])
        best.last_used, best.num_copies = next(self._clock), best.num_copies + 1
        return best_length

    def _free_slot(self) -> Slot | None:
        # Prefer never-owned slots (lowest index, which keeps batches contiguous), then the
        # least recently used idle conversation.
        unowned = [s for s in self.slots if not s.is_busy and s.session is None]
        if unowned:
            return unowned[0]
        idle = [s for s in self.slots if not s.is_busy]
        return min(idle, key=lambda s: s.last_used) if idle else None

    def note_written(self, index: int, end: int) -> None:
        """Positions [0, end) of slot ``index`` now hold k/v."""
        self._initialized[index] = max(self._initialized[index], end)

    def prepare_read(self, slots: list[int], positions: list[int], kv_len: int) -> None:
        """A batched decode reads positions [0, kv_len) of every slot, masked beyond each one's own
        position. Masked keys get zero weight, but 0 * NaN is NaN, so never-written memory in that
        range is zeroed first (once; later occupants leave finite stale values, which is fine)."""
        for index, position in zip(slots, positions):
            start = max(self._initialized[index], position + 1)
            if start < kv_len:
                self.tensors.k[:, index, :, start:kv_len].zero_()
                self.tensors.v[:, index, :, start:kv_len].zero_()
                self._initialized[index] = kv_len

    def release(self, index: int, cached_tokens: list[int]) -> None:
        """The sequence in slot ``index`` ended; ``cached_tokens`` are the ids whose k/v it wrote.
        A session keeps them for its next turn; an anonymous slot becomes free."""
        slot = self.slots[index]
        slot.is_busy = False
        slot.tokens = list(cached_tokens) if slot.session is not None else []
        slot.last_used = next(self._clock)

    def drop_session(self, session: str) -> None:
        """Forget a conversation; its slot becomes free (unless busy: then when it is released)."""
        slot = self._by_session.pop(session, None)
        if slot is not None:
            slot.session = None
            if not slot.is_busy:
                slot.tokens = []

    @property
    def num_busy(self) -> int:
        return sum(s.is_busy for s in self.slots)

    @property
    def num_sessions(self) -> int:
        return len(self._by_session)

    @property
    def nbytes(self) -> int:
        return self.tensors.k.nbytes + self.tensors.v.nbytes
