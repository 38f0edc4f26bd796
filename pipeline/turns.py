"""Turn bookkeeping for one session: turn numbers, which turns may be heard, and what the history
keeps of each turn once it is over.

A voice turn's answer starts speculatively at the user's first pause; until ``SpeechEnded`` commits
the turn its output frames are held, and an ``Interrupt`` (the user went on, or barged in) discards
them unseen. When a turn is over, the history keeps what the user heard of its answer: all of it,
the part played before an interruption, or nothing for a speculative answer nobody heard (even
one whose exchange begins only after the interruption: pipeline/llm/history.py).
"""
from __future__ import annotations

import threading

from pipeline.frames import AudioOut, Frame, SpeakChunk, TextDelta, Transcript, TurnDone
from pipeline.llm.history import History
from pipeline.playback import PlaybackTracker
from pipeline.waterfall import WaterfallBook

DROPPED_ON_INTERRUPT = (AudioOut, TextDelta, SpeakChunk)  # an old turn's audio and text: never play it
KEPT_TURNS = 8  # playback spans and commit marks of turns this far back are forgotten


class TurnCounter:
    """Hands out increasing turn numbers (``gen``); one per pipeline (per session)."""

    def __init__(self) -> None:
        self._value = 0
        self._lock = threading.Lock()

    @property
    def current(self) -> int:
        return self._value

    def next(self) -> int:
        with self._lock:
            self._value += 1
            return self._value


class Turns:
    """The session's turns at the output end: committed, held (speculative) and interrupted ones,
    what was played of each (``PlaybackTracker``) and the history's settlement.

    ``route``, ``interrupt``, ``commit`` and ``released`` are called under the pipeline's delivery
    lock, in the order frames reach the front end; ``report_playback`` from the front end's thread.
    """

    def __init__(self, history: History, book: WaterfallBook):
        self.counter = TurnCounter()
        self.history = history
        self.book = book
        self.tracker = PlaybackTracker()
        self.interrupted_below = 0  # data frames of older turns are dropped at the output too
        self._committed: set[int] = set()  # turns whose answer may be played
        self._held: dict[int, list[Frame]] = {}  # speculative answers waiting for their commit

    def open_committed(self) -> int:
        """A new turn that is complete as it starts (typed text, a spoken notice): nothing speculative."""
        gen = self.counter.next()
        self._committed.add(gen)
        return gen

    def route(self, frame: Frame) -> bool:
        """A data frame at the output: True to send it on now; otherwise it is dropped (an
        interrupted turn's audio or text) or held until its turn is committed. Partial transcripts
        are never held."""
        if frame.gen < self.interrupted_below and isinstance(frame, DROPPED_ON_INTERRUPT):
            return False
        is_partial = isinstance(frame, Transcript) and not frame.is_final
        if frame.gen not in self._committed and not is_partial:
            self._held.setdefault(frame.gen, []).append(frame)
            return False
        return True

    def interrupt(self, gen: int) -> None:
        """Turns older than ``gen`` are over: their held answers go, the history settles them."""
        self.interrupted_below = max(self.interrupted_below, gen)
        for old in [g for g in self._held if g < gen]:
            del self._held[old]
        self._settle_before(gen)
        # Long sessions stay flat: playback spans and commit marks of long-gone turns are dropped.
        self.tracker.forget_before(gen - KEPT_TURNS)
        self._committed = {g for g in self._committed if g >= gen - KEPT_TURNS}

    def commit(self, gen: int) -> list[Frame]:
        """The user's turn ``gen`` ended: its answer may be played. Returns the frames held for it."""
        self._committed.add(gen)
        return self._held.pop(gen, [])

    def released(self, frame: Frame) -> None:
        """``frame`` goes to the front end now: note the audio sent and the turn's end."""
        if isinstance(frame, AudioOut):
            self.tracker.on_audio(frame.gen, frame.chunk_index, frame.text, frame.start_sample, len(frame.pcm),
                                  frame.sample_rate)
            self.book.mark(frame.gen, "first_audio_out")
        elif isinstance(frame, TurnDone):
            self.tracker.on_done(frame.gen)
            self.book.mark(frame.gen, "audio_done")
            frame.waterfall = self.book.get(frame.gen)

    def report_playback(self, gen: int, played_samples: int) -> None:
        """The front end has played ``played_samples`` of turn ``gen``'s audio."""
        if self.tracker.report(gen, played_samples):
            self.book.mark(gen, "first_audio_played")
        if self.tracker.is_complete(gen):
            self.history.settle(gen)

    def _settle_before(self, gen: int) -> None:
        """Old turns are over: keep what was heard of each (cut + interrupted) in the history;
        a speculative answer nobody heard leaves no trace. An answer whose exchange begins only
        now (the LLM stage was still reading its words) is settled by the history as it begins:
        first, so that no exchange begins between this sweep and that rule."""
        self.history.end_before(gen, self._committed)
        for old in self.history.unsettled(gen):
            if old not in self._committed:
                self.history.drop(old)
            elif self.tracker.is_complete(old):
                self.history.settle(old)
            else:
                heard = self.tracker.heard_text(old)
                self.history.cut(old, heard)
                self.book.mark(old, "interrupted")
                self.book.set(old, "interrupted", 1)
                self.book.set(old, "heard_words", len(heard.split()))
