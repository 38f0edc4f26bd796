"""Stop strings over a stream of text deltas, shared by every backend."""
from __future__ import annotations


class StopStringFilter:
    """Cuts a stream of text deltas at the first stop string, which is never emitted.

    Text that could be the start of a stop string is held back until the next delta decides,
    so a stop string split across two deltas is still caught.
    """

    def __init__(self, stops: tuple[str, ...] | list[str]):
        self.stops = tuple(s for s in stops if s)
        self._held = ""

    def feed(self, delta: str) -> tuple[str, bool]:
        """Returns (text safe to emit, whether a stop string was reached)."""
        if not self.stops:
            return delta, False
        text = self._held + delta
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self._held = ""
            return text[:cut], True
        keep = 0  # longest suffix of text that is a prefix of some stop string
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:n]):
                    keep = max(keep, n)
                    break
        self._held = text[len(text) - keep:] if keep else ""
        return text[: len(text) - keep], False

    def flush(self) -> str:
        """The held-back text, at the end of a stream that never reached a stop string."""
        held, self._held = self._held, ""
        return held
