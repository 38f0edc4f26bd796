"""Sampling settings for one request; every LLM backend accepts them."""
from __future__ import annotations

from dataclasses import dataclass, field

MAX_SEED = 2**63  # seeds are in [0, 2**63): torch's generators take a signed 64-bit value
MAX_STOPS = 4
MAX_STOP_CHARS = 64  # the stop filter's work per token grows with the number x length of stops


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop. ``temperature == 0`` means greedy."""

    temperature: float = 0.7
    top_p: float = 0.9
    top_k: int = 0  # 0 = off
    repetition_penalty: float = 1.0  # 1.0 = off
    # DRY ("don't repeat yourself", as in llama.cpp and koboldcpp): a token that would continue a run
    # of the answer's own earlier tokens at least dry_allowed_length long loses
    # dry_multiplier * dry_base ** (run - dry_allowed_length) of its logit, so a loop ("sunglasses,
    # sunglasses, sunglasses") is pushed out within a repeat or two while a word used twice is not
    # touched. Over the output only: repeating the user's words ("Repeat after me") stays free.
    dry_multiplier: float = 0.0  # 0 = off
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    max_tokens: int = 256
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)  # stop strings, not included in the output

    def __post_init__(self) -> None:
        # "field: message", the form config loaders turn into a keyed error
        if not 0.0 <= self.temperature <= 5.0:
            raise ValueError(f"temperature: must be in [0, 5], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k: must be >= 0, got {self.top_k}")
        if not 0.5 <= self.repetition_penalty <= 2.0:
            raise ValueError(f"repetition_penalty: must be in [0.5, 2], got {self.repetition_penalty}")
        if not 0.0 <= self.dry_multiplier <= 5.0:
            raise ValueError(f"dry_multiplier: must be in [0, 5], got {self.dry_multiplier}")
        if not 1.0 <= self.dry_base <= 4.0:
            raise ValueError(f"dry_base: must be in [1, 4], got {self.dry_base}")
        if not 1 <= self.dry_allowed_length <= 32:
            raise ValueError(f"dry_allowed_length: must be in [1, 32], got {self.dry_allowed_length}")
        if not 1 <= self.max_tokens <= 32768:
            raise ValueError(f"max_tokens: must be in [1, 32768], got {self.max_tokens}")
        if self.seed is not None and not 0 <= self.seed < MAX_SEED:
            raise ValueError(f"seed: must be in [0, 2**63), got {self.seed}")
        if len(self.stop) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in self.stop):
            raise ValueError(f"stop: at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def is_plain(self) -> bool:
        """No penalty reads the sequence's tokens: the logits alone decide (the batched fast path)."""
        return self.repetition_penalty == 1.0 and self.dry_multiplier == 0.0
