"""Per-turn timings on one monotonic clock, and counts: the latency waterfall.

Marks, in the order a voice turn meets them: ``speech_start``, ``speech_end`` (the last voiced
frame arrived), ``speech_paused`` (pause_ms later: the answer starts), ``turn_judged`` (the
end-of-turn signals are in, "semantic" mode), ``turn_end_detected`` (the end silence was
reached: the turn is committed), ``asr_final``, ``last_word_timed`` (its last word's alignment
pass done, after the final),
``llm_request``, ``llm_first_token``, ``first_chunk_ready``, ``first_audio_ready`` (synthesized;
held until the turn is committed), ``first_audio_out`` (sent to the front end),
``first_audio_played`` (when the front end reports playback), ``llm_done``, ``audio_done``,
``interrupted`` (a later turn cut this one off).
A typed turn starts at ``text_in`` instead of ``speech_end``.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

ORDER = ("speech_start", "speech_end", "speech_paused", "turn_judged", "turn_end_detected", "text_in", "asr_final", "last_word_timed", "llm_request",
         "llm_first_token", "first_chunk_ready", "first_audio_ready", "first_audio_out", "first_audio_played", "llm_done",
         "audio_done", "interrupted")


@dataclass
class TurnWaterfall:
    """One turn's marks (monotonic seconds) and counts."""

    gen: int
    marks: dict[str, float] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        """Milliseconds from the turn's origin (``speech_end``, else ``text_in``), in stage order."""
        origin_name = "speech_end" if "speech_end" in self.marks else "text_in"
        origin = self.marks.get(origin_name)
        ms = {}
        if origin is not None:
            for name in ORDER:
                if name in self.marks:
                    ms[name] = round(1000 * (self.marks[name] - origin), 1)
        return {"gen": self.gen, "origin": origin_name, "ms": ms, "counts": dict(self.counts),
                "t_origin": origin}


class WaterfallBook:
    """All turns' waterfalls for one session; any stage thread may mark."""

    def __init__(self, keep: int = 64):
        self._turns: dict[int, TurnWaterfall] = {}
        self._lock = threading.Lock()
        self._keep = keep  # old turns are forgotten: a long session must not grow without bound

    def _turn(self, gen: int) -> TurnWaterfall:
        turn = self._turns.get(gen)
        if turn is None:
            turn = self._turns[gen] = TurnWaterfall(gen)
            for old in sorted(self._turns)[: max(0, len(self._turns) - self._keep)]:
                del self._turns[old]
        return turn

    def mark(self, gen: int, name: str, t: float | None = None) -> None:
        """Records the first time ``name`` happens in turn ``gen`` (later marks are ignored)."""
        with self._lock:
            self._turn(gen).marks.setdefault(name, time.monotonic() if t is None else t)

    def add(self, gen: int, name: str, amount: float) -> None:
        with self._lock:
            counts = self._turn(gen).counts
            counts[name] = counts.get(name, 0) + amount

    def set(self, gen: int, name: str, value) -> None:
        with self._lock:
            self._turn(gen).counts[name] = value

    def marks(self, gen: int) -> dict[str, float]:
        """The raw monotonic marks of turn ``gen``."""
        with self._lock:
            turn = self._turns.get(gen)
            return dict(turn.marks) if turn else {}

    def get(self, gen: int) -> dict:
        with self._lock:
            turn = self._turns.get(gen)
            return turn.as_dict() if turn else {"gen": gen, "origin": None, "ms": {}, "counts": {}, "t_origin": None}
