"""``ModelRunner``: turns a step plan into model forwards (packed prefill chunks, batched decode)
and sampled tokens.

It owns the model and the cache tensors and builds each forward's ``AttentionBatch``: where the new
k/v go, which cache rows are read, and the boolean mask (only what differing lengths need). With the
kernels (engine/kernels.py) and fp32 activations, a decode batch is one native call instead
(``engine.native_step``: the whole layer stack and the LM head in C++), which needs none of that:
each sequence reads exactly its own length.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch
from torch import Tensor

from engine import native_step
from engine.kv_cache import KVCache
from engine.model import AttentionBatch, PackedBatch, Transformer, visible_keys
from engine.sampler import Sampler, probability_of
from engine.scheduler import StepPlan
from engine.sequence import Sequence


@dataclass
class RunResult:
    """What one plan's forwards produced: a sampled token per sequence that has one, for a probe
    request whose prompt is now cached P(next token in its probe ids) instead, and the sequences
    whose own sampling settings made sampling raise (each with its error)."""

    tokens: list[tuple[Sequence, int]] = field(default_factory=list)
    probes: list[tuple[Sequence, float]] = field(default_factory=list)
    failed: list[tuple[Sequence, Exception]] = field(default_factory=list)


def inner_probes(prefills: list[tuple[Sequence, int, int]]) -> list[tuple[Sequence, int]]:
    """The chunks that hold a generating request's probe (``Sequence.probe_at``): (sequence, the
    row on the packed token axis whose logits give P(prompt token probe_at in its probe ids))."""
    found, offset = [], 0
    for seq, start, end in prefills:
        if seq.probe_at is not None and seq.probe_ids is not None and start <= seq.probe_at - 1 < end:
            found.append((seq, offset + seq.probe_at - 1 - start))
        offset += end - start
    return found


def per_chunk(logits: Tensor | None, num_chunks: int, wanted: list[int], num_inner: int) -> list[Tensor | None]:
    """Logits rows [wanted chunks' last tokens, inner probe rows, ...] -> one entry per chunk (None
    where its logits were not wanted), then one per inner probe row."""
    out: list[Tensor | None] = [None] * num_chunks
    for row, i in enumerate(wanted):
        out[i] = logits[row]
    return out + [logits[len(wanted) + k] for k in range(num_inner)]


def step_rows(chunks: list[tuple[int, list[int], int, bool]], slots: list[int], token_ids: list[int],
              positions: list[int], inner_rows: list[int] | None = None
              ) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """The one-call step's rows: the prompt chunks' tokens (slot, token ids, start, want_logits), then a
    decode batch's -> (token ids, positions, slots, the chunks that want logits, the logit rows: those
    chunks' last rows, then ``inner_rows``, then the decode rows)."""
    tokens = [t for _, ids, _, _ in chunks for t in ids] + list(token_ids)
    rows_positions = [start + i for _, ids, start, _ in chunks for i in range(len(ids))] + list(positions)
    rows_slots = [slot for slot, ids, _, _ in chunks for _ in ids] + list(slots)
    ends = [end - 1 for end in itertools.accumulate(len(ids) for _, ids, _, _ in chunks)]
    wanted = [i for i, chunk in enumerate(chunks) if chunk[3]]
    prompt_rows = len(tokens) - len(slots)
    logit_rows = [ends[i] for i in wanted] + list(inner_rows or []) + list(range(prompt_rows, len(tokens)))
    return tokens, rows_positions, rows_slots, wanted, logit_rows


# How long the one-call step's helper threads stay awake for a step the engine says follows (expect_step):
# the engine's Python between two decode steps takes ~0.1-0.3 ms; a step later than this is not "soon".
EXPECT_STEP_US = 2000


class ModelRunner:
    """Runs prefill chunks and decode batches of our ``Transformer`` against a ``KVCache``, and
    samples each sequence's next token from the logits."""

    def __init__(self, model: Transformer, kv_cache: KVCache, sampler: Sampler | None = None, compile: bool = False):
        self.model = model
        self.kv_cache = kv_cache
        self.sampler = sampler or Sampler()
        # The one-call decode step needs the model's kernels (torch.ops.voxlane) and fp32 activations.
        self.fused_decode = native_step.supports(model, kv_cache.tensors)
        self.decoder = native_step.build_decoder(model, kv_cache.tensors) if self.fused_decode else None
        # The engine loop's steps and expect_step as C calls (StepCalls: cheaper per step).
        self.step_calls = (native_step.StepCalls(self.decoder, model.args.vocab_size) if self.decoder is not None
                           else None)
        self.group = model.args.num_heads // model.args.num_kv_heads  # R query heads per kv head
        self._decode_forward = model.forward
        self._decode_rows: dict[int, tuple[Tensor, ...]] = {}  # decode(): the step's inputs by batch size
        if compile:
            # dynamic=True: batch size and cache length change every step; one graph for all.
            self._decode_forward = torch.compile(model.forward, dynamic=True)

    def run(self, plan: StepPlan) -> RunResult:
        """The plan's forwards -> a sampled token for each prompt chunk that ends its prompt (its
        logits pick the first new token; a probe's give its probability instead) and for each
        sequence of the decode batch. Prompt chunks and decode rows are one native call when the
        runner has the one-call step (one pass over the weights for both), else two forwards."""
        result = RunResult()
        # A chunk that ends its prompt wants logits: they pick the sequence's first new token.
        chunks = [(seq.slot, seq.prompt_ids[start:end], start, end == len(seq.prompt_ids))
                  for seq, start, end in plan.prefills]
        inner = inner_probes(plan.prefills)  # requests that generate, probed inside their prompt
        inner_rows = [row for _, row in inner]
        seqs = plan.decode
        if self.step_calls is not None and not inner:
            if self._greedy(plan):
                return self._run_greedy(chunks, plan, result)
            return self._run_sampled(chunks, plan, result)
        decode = ([s.slot for s in seqs], [s.last_token for s in seqs], [s.num_tokens - 1 for s in seqs])
        if chunks and seqs and self.fused_decode:
            prefill_logits, decode_logits = self.prefill_and_decode(chunks, *decode, inner_rows=inner_rows)
        else:
            prefill_logits = self.prefill_many(chunks, inner_rows) if chunks else []
            decode_logits = self.decode(*decode) if seqs else None
        for (seq, _), logits in zip(inner, prefill_logits[len(chunks):]):
            result.probes.append((seq, probability_of(logits, seq.probe_ids)))
        for (seq, _, _), logits in zip(plan.prefills, prefill_logits[:len(chunks)]):
            if logits is not None:
                self._prompt_end(seq, logits, result)
        if seqs:
            self._sample(decode_logits, seqs, result)
        return result

    def _prompt_end(self, seq: Sequence, logits: Tensor, result: RunResult) -> None:
        """A prompt's last logits [V]: a probe's probability (a probe-only request), else its first token."""
        if seq.probe_ids is not None and seq.probe_at is None:
            result.probes.append((seq, probability_of(logits, seq.probe_ids)))
        else:
            self._sample(logits[None], [seq], result)

    def _greedy(self, plan: StepPlan) -> bool:
        """Whether every token the plan samples is its row's argmax: greedy plain decode rows, and prompts
        that end here greedy, plain and not probed."""
        ending = [seq for seq, _, end in plan.prefills if end == len(seq.prompt_ids)]
        return (self.sampler.all_greedy(plan.decode) and self.sampler.all_greedy(ending)
                and all(seq.probe_ids is None for seq in ending))

    def _run_greedy(self, chunks: list[tuple[int, list[int], int, bool]], plan: StepPlan,
                    result: RunResult) -> RunResult:
        """A greedy plan in one C call (``StepCalls``): the step's argmax of each prompt that ends here
        (its first new token) and of each decode row; the logits stay in the step, the sampler does not
        read them. Why: on a prompt's TTFT the custom-class call, its input tensors, the logits' rows and
        numpy's argmax took ~0.3-0.6 ms of Python after the step had streamed the weights."""
        seqs = plan.decode
        slots, positions = [s.slot for s in seqs], [s.num_tokens - 1 for s in seqs]
        if chunks:
            tokens, rows_positions, rows_slots, wanted, logit_rows = step_rows(
                chunks, slots, [s.last_token for s in seqs], positions)
            found = self.step_calls.rows(tokens, rows_positions, rows_slots, logit_rows)
            self._note_chunks(chunks)
            sampled = [plan.prefills[i][0] for i in wanted] + seqs
        else:
            found = self.step_calls.step([s.last_token for s in seqs], positions, slots)
            sampled = seqs
        self._note_decoded(slots, positions)
        result.tokens += zip(sampled, found)
        return result

    def _run_sampled(self, chunks: list[tuple[int, list[int], int, bool]], plan: StepPlan,
                     result: RunResult) -> RunResult:
        """A plan that samples (or probes a prompt's end) in one C call (``StepCalls.logits``): the logits of
        each prompt that ends here, then of each decode row, come back in one buffer, and go to the sampler
        (or ``probability_of``) as ``run`` sends them. Why: the custom-class call, its four input tensors
        and its returned tensor cost a sampled step ~0.1-0.3 ms of Python that a greedy one no longer pays."""
        seqs = plan.decode
        slots, positions = [s.slot for s in seqs], [s.num_tokens - 1 for s in seqs]
        tokens, rows_positions, rows_slots, wanted, logit_rows = step_rows(
            chunks, slots, [s.last_token for s in seqs], positions)
        logits = self.step_calls.logits(tokens, rows_positions, rows_slots, logit_rows)  # [L, V]
        self._note_chunks(chunks)
        self._note_decoded(slots, positions)
        for i, chunk in enumerate(wanted):
            self._prompt_end(plan.prefills[chunk][0], logits[i], result)
        if seqs:
            self._sample(logits[len(wanted):], seqs, result)
        return result

    def expect_step(self, follows: bool) -> None:
        """Whether the engine runs another step at once: the one-call step's helper threads stay awake
        for it (woken now if asleep; ``NativeDecoder.expect_step``), or may sleep (no step follows)."""
        if self.step_calls is not None:
            self.step_calls.expect_step(EXPECT_STEP_US if follows else 0)

    def _sample(self, logits: Tensor, seqs: list[Sequence], result: RunResult) -> None:
        """One token per sequence from logits [B, V], the whole batch at once. When that raises (a
        row's own settings, e.g. a seed torch cannot take), the rows are sampled one by one and only
        the failing sequence goes to ``result.failed``: a fault one request causes is its own."""
        try:
            result.tokens += zip(seqs, self.sampler.sample(logits, seqs))
            return
        except Exception:  # some row's own settings: sample row by row to find it
            pass
        for i, seq in enumerate(seqs):
            try:
                result.tokens.append((seq, self.sampler.sample(logits[i:i + 1], [seq])[0]))
            except Exception as error:
                result.failed.append((seq, error))

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
    def prefill_many(self, chunks: list[tuple[int, list[int], int, bool]],
                     inner_rows: list[int] | None = None) -> list[Tensor | None]:
        """Several sequences' prompt chunks (slot, token ids, start, want_logits) in one forward ->
        logits [V] of each chunk's last token (None where not wanted), then those of ``inner_rows``
        (indices on the packed token axis: a probe inside a prompt).

        Why one forward: prompts that arrive together were prefilled one per step, each forward
        reading all the weights for a few rows. Packed along the token axis (``PackedBatch``), the
        linear layers read them once; attention still runs per chunk, over its own slot only.
        """
        if self.fused_decode:
            return self.prefill_and_decode(chunks, [], [], [], inner_rows=inner_rows)[0]
        batches = [self._prefill_batch(slot, start, len(ids)) for slot, ids, start, _ in chunks]
        lengths = [len(ids) for _, ids, _, _ in chunks]
        batch = batches[0] if len(chunks) == 1 else PackedBatch(batches, lengths)
        tokens = torch.tensor([[t for _, ids, _, _ in chunks for t in ids]])  # [1, T]
        positions = torch.cat([b.positions for b in batches], dim=1)  # [1, T]
        hidden = self.model(tokens, positions, self.kv_cache.tensors, batch)  # [1, T, D]
        self._note_chunks(chunks)
        ends = torch.tensor(lengths).cumsum(0) - 1  # each chunk's last token on the packed axis
        wanted = [i for i, chunk in enumerate(chunks) if chunk[3]]
        rows = torch.cat([ends[wanted], torch.tensor(inner_rows or [], dtype=torch.long)])
        logits = self.model.logits(hidden[0, rows]) if len(rows) else None  # [n, V]
        return per_chunk(logits, len(chunks), wanted, len(inner_rows or []))

    @torch.inference_mode()
    def prefill_and_decode(self, chunks: list[tuple[int, list[int], int, bool]], slots: list[int],
                           token_ids: list[int], positions: list[int],
                           inner_rows: list[int] | None = None) -> tuple[list[Tensor | None], Tensor]:
        """Prompt chunks (as ``prefill_many``) and a decode batch (as ``decode``) in ONE native call,
        so a prompt arriving while others decode costs no extra pass over the weights: every token is
        a row with its own slot and position (a chunk's rows attend each other causally through the
        cache). -> (each chunk's last-token logits or None, then ``inner_rows``' logits (as
        ``prefill_many``), the decode rows' logits [B, V])."""
        tokens, rows_positions, rows_slots, wanted, logit_rows = step_rows(chunks, slots, token_ids, positions,
                                                                           inner_rows)
        logits = self.decoder.step(torch.tensor(tokens), torch.tensor(rows_positions), torch.tensor(rows_slots),
                                   torch.tensor(logit_rows, dtype=torch.long))
        self._note_chunks(chunks)
        self._note_decoded(slots, positions)
        inner = len(inner_rows or [])
        return per_chunk(logits, len(chunks), wanted, inner), logits[len(wanted) + inner:]

    @torch.inference_mode()
    def decode(self, slots: list[int], token_ids: list[int], positions: list[int]) -> Tensor:
        """One new token per sequence (slots sorted ascending) -> logits [B, V]."""
        if self.fused_decode:  # prefill_and_decode without chunks, minus its ~30 us of list and tensor work
            logits = self.decoder.step(*self._decode_inputs(token_ids, positions, slots))
            self._note_decoded(slots, positions)
            return logits
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
        self._note_decoded(slots, positions)
        return self.model.logits(hidden[:, 0])

    def _note_chunks(self, chunks: list[tuple[int, list[int], int, bool]]) -> None:
        """A step wrote each prompt chunk's k/v at positions start.. of its slot."""
        for slot, ids, start, _ in chunks:
            self.kv_cache.note_written(slot, start + len(ids))

    def _note_decoded(self, slots: list[int], positions: list[int]) -> None:
        """A decode step wrote each row's new token's k/v at its position in its slot."""
        for slot, position in zip(slots, positions):
            self.kv_cache.note_written(slot, position + 1)

    def _decode_inputs(self, token_ids: list[int], positions: list[int], slots: list[int]) -> tuple[Tensor, ...]:
        """The one-call step's (tokens, positions, slots, logit rows) of a decode batch: views of one int64
        buffer per batch size, written in place (the step reads them during the call only), instead of
        four new tensors a step (~14 us)."""
        B = len(slots)
        rows = self._decode_rows.get(B)
        if rows is None:
            buffer = torch.zeros(4, B, dtype=torch.long)
            buffer[3] = torch.arange(B)  # every row's logits
            rows = self._decode_rows[B] = (*buffer, buffer.numpy())
        rows[4][:3] = (token_ids, positions, slots)
        return rows[:4]
