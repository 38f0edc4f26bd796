"""An answer started at a partial transcript, while the user may still be speaking."""
from __future__ import annotations

from dataclasses import dataclass

from engine.backends.base import Completion
from engine.sampling_params import SamplingParams


@dataclass
class EarlyAnswer:
    """The answer submitted for a partial transcript whose words already read as a finished
    sentence (the engine's probe of them, "semantic" endpointing). When the user stops there, the
    final transcript says the same words and this request has been generating since: the final
    adopts it, and the model's time to the first speakable words is spent while the user was still
    finishing the turn. Anything else cancels it: a partial with other words, a final that differs
    in any character or whose prompt or sampling differ, an interruption, the session's end."""

    gen: int
    text: str  # the partial transcript as ASR wrote it
    messages: list[dict]
    sampling: SamplingParams
    completion: Completion  # on our engine held after its first tokens until adopted (released)

    def answers(self, messages: list[dict], sampling: SamplingParams) -> bool:
        """Whether this request (to the final's words) is exactly the answer the final would ask for."""
        return (self.messages, self.sampling) == (messages, sampling)
