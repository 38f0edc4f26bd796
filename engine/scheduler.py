"""The scheduler moves sequences between the ``waiting`` and ``running`` deques, nothing more.

Each step it (1) removes cancelled sequences and frees their slots, (2) admits waiting sequences
while the batch has room and a slot can be had (continuous batching: admission happens between
any two steps), and (3) plans the step: prefill *chunks* of the oldest prompts, at most
``prefill_chunk_tokens`` in all (so a long prompt only delays running streams by one chunk per
step; prompts that arrive together share one forward), and one decode token for every sequence
past its prompt. After the step ran, ``postprocess`` records what was cached and finishes the
sequences that ended.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.kv_cache import KVCache
from engine.sequence import Sequence, SequenceStatus


@dataclass
class StepPlan:
    """What one step runs: prefill chunks (sequence, start, end) of prompts, run as one forward, and
    a decode batch (sorted by slot so consecutive slots can be read from the cache as a view)."""

    prefills: list[tuple[Sequence, int, int]] = field(default_factory=list)
    decode: list[Sequence] = field(default_factory=list)
    cancelled: list[Sequence] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decode


class Scheduler:
    """Waiting/running deques, slot admission, chunked prefill planning and cancellation."""

    def __init__(self, kv_cache: KVCache, max_batch_size: int, prefill_chunk_tokens: int):
        self.kv_cache = kv_cache
        self.max_batch_size = max_batch_size
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self._cancel_requested: set[int] = set()

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def cancel(self, seq_id: int) -> None:
        """Takes effect at the next ``schedule()``: the sequence ends and its slot is released."""
        self._cancel_requested.add(seq_id)

    def set_held(self, seq_id: int, held: bool) -> None:
        """Held: the sequence is not decoded after the tokens it has written (``Sequence.hold_after``),
        keeping its slot; not held: it is decoded again from the next step."""
        for seq in (*self.waiting, *self.running):
            if seq.id == seq_id:
                seq.hold_after = max(len(seq.output_ids), 1) if held else None

    @property
    def has_work(self) -> bool:
        """Whether a step could do anything (held sequences alone give it nothing to do)."""
        return bool(self.waiting or self._cancel_requested or any(not s.is_held for s in self.running))

    def schedule(self) -> StepPlan:
        plan = StepPlan(cancelled=self._remove_cancelled())
        self._admit()
        budget = self.prefill_chunk_tokens
        for seq in self.running:
            if seq.is_prefilling and budget > 0:  # FIFO: the oldest admitted prompts come first
                end = min(len(seq.prompt_ids), seq.num_cached + budget)
                plan.prefills.append((seq, seq.num_cached, end))
                budget -= end - seq.num_cached
        plan.decode = sorted((s for s in self.running if not s.is_prefilling and not s.is_held), key=lambda s: s.slot)
        return plan

    def postprocess(self, plan: StepPlan, finished: list[tuple[Sequence, str]]) -> None:
        """After ``plan`` ran: the k/v it wrote are cached (this is the only place ``num_cached``
        moves after admission), and the sequences that ended with it are finished."""
        for seq, _, end in plan.prefills:
            seq.num_cached = end
        for seq in plan.decode:
            seq.num_cached += 1  # the k/v of the token it fed
        for seq, reason in finished:
            self.finish(seq, reason)

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a running sequence; its slot keeps the tokens whose k/v were written (for a session)."""
        if seq.status is SequenceStatus.FINISHED:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.kv_cache.release(seq.slot, seq.all_ids[: seq.num_cached])
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def _remove_cancelled(self) -> list[Sequence]:
        if not self._cancel_requested:
            return []
        ids, self._cancel_requested = self._cancel_requested, set()
        cancelled = [s for s in (*self.waiting, *self.running) if s.id in ids]
        for seq in cancelled:
            self.finish(seq, "cancelled")
        return cancelled

    def _admit(self) -> None:
        # Scan in arrival order; a sequence whose session slot is still busy is skipped, not a
        # barrier for the others behind it.
        for seq in list(self.waiting):
            if len(self.running) >= self.max_batch_size:
                break
            # A probe inside the prompt needs the logits of the token before probe_at: it is recomputed.
            limit = None if seq.probe_at is None else seq.probe_at - 1
            claim = self.kv_cache.acquire(seq.session, seq.prompt_ids, limit)
            if claim is None:
                continue
            seq.slot, seq.num_cached = claim
            seq.num_reused = seq.num_cached
            seq.status = SequenceStatus.RUNNING
            self.waiting.remove(seq)
            self.running.append(seq)
