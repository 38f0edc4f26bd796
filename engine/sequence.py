"""``Sequence``: one request as it moves through the engine (nano-vllm's shape: it owns its token
ids and its cache slot; the scheduler only moves it between deques)."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from enum import Enum

from engine.sampling_params import SamplingParams


class SequenceStatus(Enum):
    WAITING = "waiting"  # queued, no slot yet
    RUNNING = "running"  # holds a slot: prefilling its prompt, then decoding
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """Prompt and output token ids, sampling settings, slot, progress and timing of one request."""

    id: int
    prompt_ids: list[int]
    sampling: SamplingParams
    session: str | None = None
    # A probe: prefill only, then P(next token in probe_ids) instead of sampling (see LLMEngine.submit).
    probe_ids: frozenset[int] | None = None
    # With probe_ids, a request that generates: P(prompt token probe_at in probe_ids) is read from the
    # logits of the token before it in the same prefill (LLMEngine.submit), then sampling goes on.
    probe_at: int | None = None
    # An early answer (pipeline/llm/early_answer.py): after this many output tokens it is not decoded
    # until released (LLMEngine.release), keeping its slot; None: never held.
    hold_after: int | None = None
    output_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    slot: int = -1
    num_cached: int = 0  # leading tokens of all_ids whose k/v are in the slot
    num_reused: int = 0  # prompt tokens found already cached in the session's slot at admission
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" | "error"
    arrival_s: float = field(default_factory=time.perf_counter)
    first_token_s: float | None = None
    finish_s: float | None = None

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def last_token(self) -> int:
        """The token the next decode step feeds (its k/v is not cached yet)."""
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def is_prefilling(self) -> bool:
        """True until every prompt token's k/v is cached (the first output token then follows)."""
        return self.num_cached < len(self.prompt_ids)

    @property
    def is_held(self) -> bool:
        """True while it waits for a release, ``hold_after`` tokens written."""
        return self.hold_after is not None and len(self.output_ids) >= self.hold_after

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s


class SequenceIds:
    """Hands out request ids (one counter per engine, no module globals)."""

    def __init__(self):
        self._counter = itertools.count(1)

    def next(self) -> int:
        return next(self._counter)
