"""The Stage base: in-queue → ``process()`` → downstream, on its own thread.

System frames are handled at once on the thread that delivers them (``on_system``), then passed
on, so an interruption reaches every stage within microseconds even while a stage is busy inside
a model call. Data frames wait in the in-queue and are processed in order; frames of a
turn older than the newest ``Interrupt`` are dropped, queued or not.
"""
from __future__ import annotations

import contextvars
import logging
import threading
from typing import Callable, Iterable

from pipeline.frame_queue import FrameQueue
from pipeline.frames import ErrorFrame, Frame, Interrupt, SystemFrame

log = logging.getLogger(__name__)

Sink = Callable[[Frame], None]


class TurnRefused(Exception):
    """A turn a stage will not do, with a message written for the user (the turn's error says it).
    Any other exception is a failure: the user gets a generic message, the log the details."""
_STOP = object()  # the sentinel that ends a stage's thread


class Stage:
    """One step of the pipeline. Subclasses override ``process`` (and ``on_system`` to cancel
    work in flight); anything ``process`` does not consume it should yield on unchanged."""

    name = "stage"

    def __init__(self, queue_size: int = 2000):
        self._inbox = FrameQueue(queue_size)
        self._downstream: Sink = lambda frame: None
        self._min_gen = 0
        self._system_lock = threading.Lock()  # interrupts may arrive from several threads at once
        self._thread: threading.Thread | None = None

    def connect(self, downstream: Sink) -> None:
        self._downstream = downstream

    # --- called by the upstream stage (any thread) -------------------------------------------

    def put(self, frame: Frame) -> None:
        if isinstance(frame, SystemFrame):
            with self._system_lock:
                if isinstance(frame, Interrupt) and frame.gen > self._min_gen:
                    self._purge(frame)
            self.on_system(frame)
            self._downstream(frame)
        else:
            self._inbox.put(frame)

    def offer(self, frame: Frame) -> bool:
        """``put`` for a caller that must never wait (the server's event loop): False, and the
        frame is not taken, when the in-queue is full."""
        if isinstance(frame, SystemFrame):
            self.put(frame)
            return True
        return self._inbox.offer(frame)

    def _purge(self, interrupt: Interrupt) -> None:
        """Drop queued data frames of turns older than ``interrupt`` (under the queue's own lock)."""
        def prepare(queued) -> None:
            self.before_purge(interrupt, queued)
            self._min_gen = interrupt.gen  # never lowered: a late, older interrupt changes nothing

        self._inbox.purge(lambda f: f is not _STOP and self._is_dropped(f), prepare)

    # --- for subclasses ----------------------------------------------------------------------

    def before_purge(self, interrupt: Interrupt, queued) -> None:
        """Called with the queue locked, before an Interrupt drops the older frames in it: a
        stage may re-label frames it must keep (ASR keeps a resumed utterance's audio)."""

    def on_system(self, frame: SystemFrame) -> None:
        """React to a system frame at once (runs on the caller's thread: keep it short)."""

    def process(self, frame: Frame) -> Iterable[Frame]:
        yield frame

    def setup(self) -> None:
        """Runs on the stage's thread before the first frame."""

    def is_turn_data(self, frame: Frame) -> bool:
        """Whether ``frame`` belongs to a turn (and dies with it). The VAD stage's raw input is
        the stream itself, not any turn's: an interruption must never drop microphone audio."""
        return True

    def _is_dropped(self, frame: Frame) -> bool:
        return self.is_turn_data(frame) and self.is_stale(frame.gen)

    def is_stale(self, gen: int) -> bool:
        """True once an Interrupt has superseded ``gen``: long work should check and stop."""
        return gen < self._min_gen

    def emit(self, frame: Frame) -> None:
        if isinstance(frame, SystemFrame) or not self.is_stale(frame.gen):
            self._downstream(frame)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        # The thread runs in its creator's context: a server session's id (app/logs.py) names its log lines.
        context = contextvars.copy_context()
        self._thread = threading.Thread(target=context.run, args=(self._run,), name=f"stage-{self.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.setup()
        while True:
            frame = self._inbox.get()
            if frame is _STOP:
                return
            if self._is_dropped(frame):
                continue
            try:
                for out in self.process(frame):
                    self.emit(out)
            except TurnRefused as refusal:
                self.emit(ErrorFrame(gen=frame.gen, stage=self.name, message=str(refusal), detail=str(refusal)))
            except Exception as error:  # a failing turn must not take the stage (and the session) down
                log.exception("stage %s failed on gen %d", self.name, frame.gen)
                self.emit(ErrorFrame(gen=frame.gen, stage=self.name, detail=f"{type(error).__name__}: {error}",
                                     message=f"Sorry, the {self.name} stage failed on this turn; the next one works."))

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Ends the thread after the frame in hand; returns False if it did not end in time."""
        self._inbox.replace_all(_STOP)
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()
