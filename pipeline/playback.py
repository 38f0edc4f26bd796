"""What the user has heard: the audio sent out per turn, against the playback position the front
end reports, so an interrupted reply is remembered only up to the words that were played."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class _Span:
    index: int
    text: str
    start: int  # samples from the start of the turn's audio
    end: int


@dataclass
class _TurnAudio:
    sample_rate: int
    t_first_out: float
    spans: list[_Span] = field(default_factory=list)
    played: int | None = None  # last reported position; None = never reported
    is_done: bool = False  # TurnDone seen: no more audio will come

    @property
    def total(self) -> int:
        return self.spans[-1].end if self.spans else 0


class PlaybackTracker:
    """Per-turn audio spans and playback positions (thread-safe)."""

    def __init__(self) -> None:
        self._turns: dict[int, _TurnAudio] = {}
        self._lock = threading.Lock()

    def on_audio(self, gen: int, index: int, text: str, start: int, num_samples: int, sample_rate: int) -> None:
        with self._lock:
            turn = self._turns.setdefault(gen, _TurnAudio(sample_rate, time.monotonic()))
            if turn.spans and turn.spans[-1].index == index:
                turn.spans[-1].end = start + num_samples
            else:
                turn.spans.append(_Span(index, text, start, start + num_samples))

    def on_done(self, gen: int) -> None:
        with self._lock:
            if gen in self._turns:
                self._turns[gen].is_done = True

    def report(self, gen: int, played_samples: int) -> bool:
        """Returns True if this is the turn's first report of audible audio."""
        with self._lock:
            turn = self._turns.get(gen)
            if turn is None:
                return False
            is_first = (turn.played or 0) == 0 and played_samples > 0
            turn.played = max(turn.played or 0, played_samples)
            return is_first

    def played(self, gen: int) -> int:
        """The reported position; without reports, an estimate: real-time playback since the
        first chunk went out (a front end that never reports still gets a sensible cut)."""
        with self._lock:
            turn = self._turns.get(gen)
            if turn is None:
                return 0
            if turn.played is not None:
                return min(turn.played, turn.total)
            return min(turn.total, int((time.monotonic() - turn.t_first_out) * turn.sample_rate))

    def is_complete(self, gen: int) -> bool:
        with self._lock:
            turn = self._turns.get(gen)
        return turn is not None and turn.is_done and self.played(gen) >= turn.total

    def heard_text(self, gen: int) -> str:
        """The words of ``gen`` played so far. Inside the chunk being played, time is shared out
        by characters (long words take longer) and a word counts once half of it has played."""
        played = self.played(gen)
        with self._lock:
            turn = self._turns.get(gen)
            spans = list(turn.spans) if turn else []
        words: list[str] = []
        for span in spans:
            if played >= span.end:
                words += span.text.split()
                continue
            if played > span.start:
                reached = len(span.text) * (played - span.start) / max(1, span.end - span.start)
                position = 0
                for word in span.text.split():
                    start = span.text.index(word, position)
                    position = start + len(word)
                    if (start + position) / 2 > reached:
                        break
                    words.append(word)
            break
        return " ".join(words)

    def forget_before(self, gen: int) -> None:
        with self._lock:
            for old in [g for g in self._turns if g < gen]:
                del self._turns[old]
