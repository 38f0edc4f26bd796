"""The engine's inbox and the background thread that steps it.

Any thread may ``submit``, ``cancel``, drop a session or ask for a shared prefix: those go into the
``Inbox`` under its lock, and the stepping thread takes them all at the start of a step. So the
scheduler, the KV cache and the model are touched by that one thread only.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

from engine.sequence import Sequence


class Inbox:
    """New sequences, cancels, session drops and shared prefixes handed to the stepping thread."""

    def __init__(self):
        self.lock = threading.Condition()
        self.closed = False
        self._sequences: deque[Sequence] = deque()
        self._cancels: list[int] = []
        self._holds: list[tuple[int, bool]] = []  # (request, held), in the order asked
        self._session_drops: list[tuple[str, threading.Event]] = []
        self._shared_prefixes: list[tuple[list[int], threading.Event]] = []

    def put_sequence(self, seq: Sequence) -> None:
        with self.lock:
            if self.closed:
                raise RuntimeError("engine is closed")
            self._sequences.append(seq)
            self.lock.notify()

    def put_cancel(self, seq_id: int) -> None:
        with self.lock:
            self._cancels.append(seq_id)
            self.lock.notify()

    def put_hold(self, seq_id: int, held: bool) -> None:
        with self.lock:
            self._holds.append((seq_id, held))
            self.lock.notify()

    def put_session_drop(self, session: str) -> threading.Event:
        """Set once the stepping thread has dropped the session."""
        done = threading.Event()
        with self.lock:
            self._session_drops.append((session, done))
            self.lock.notify()
        return done

    def put_shared_prefix(self, ids: list[int]) -> threading.Event:
        """Set once the stepping thread has prefilled ``ids`` into a shared row (or could not)."""
        done = threading.Event()
        with self.lock:
            self._shared_prefixes.append((ids, done))
            self.lock.notify()
        return done

    def take(self) -> tuple[list[Sequence], list[int], list[tuple[int, bool]], list[tuple[str, threading.Event]],
                            list[tuple[list[int], threading.Event]]]:
        """Everything handed in since the last call: (sequences, cancels, holds, session drops,
        shared prefixes)."""
        with self.lock:
            taken = list(self._sequences), self._cancels, self._holds, self._session_drops, self._shared_prefixes
            self._sequences, self._cancels, self._holds = deque(), [], []
            self._session_drops, self._shared_prefixes = [], []
        return taken

    def close(self) -> None:
        """No more sequences; the stepping thread ends."""
        with self.lock:
            self.closed = True
            self.lock.notify_all()

    @property
    def num_sequences(self) -> int:
        return len(self._sequences)

    def __bool__(self) -> bool:
        return bool(self._sequences or self._cancels or self._holds or self._session_drops or self._shared_prefixes)


class StepThread:
    """Builds the engine on its own thread, then steps it whenever there is work, until closed.

    The thread builds the model too, so that it is the process's only thread running torch's
    multi-threaded (OpenMP) ops: when a second thread also owns an OpenMP team, libgomp throttles
    every barrier and each parallel op waits for a sleeping worker (measured: a 381-token prefill
    268 ms on the loading thread, 439 ms on another).
    """

    def __init__(self, engine, build: Callable[[], None], admission_window_s: float):
        self.engine = engine
        self.inbox: Inbox = engine.inbox
        self.admission_window_s = admission_window_s
        self._build = build
        self._ready = threading.Event()
        self._failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._main, name="voxlane-engine", daemon=True)

    def start(self) -> None:
        """Returns once the engine is built; re-raises what building it raised."""
        self._thread.start()
        self._ready.wait()
        if self._failure:
            raise self._failure[0]

    def _main(self) -> None:
        try:
            self._build()
        except BaseException as error:  # start() re-raises it
            self._failure.append(error)
            return
        finally:
            self._ready.set()
        self._loop()

    def _loop(self) -> None:
        engine = self.engine
        while True:
            with self.inbox.lock:
                while not self.inbox.closed and not engine.has_work:
                    self.inbox.lock.wait()
                if self.inbox.closed:
                    return
                was_idle = not engine.scheduler.running
            if was_idle and self.admission_window_s > 0:
                time.sleep(self.admission_window_s)  # requests arriving together start together (one batch)
            try:
                did_work = engine.step()
            except BaseException as error:  # a batched forward failed: never die silently
                engine.fail_running(error)
                continue
            if not did_work:  # e.g. a request waits for a session slot a held request keeps: until news
                with self.inbox.lock:
                    while not self.inbox.closed and not self.inbox:
                        self.inbox.lock.wait()

    def join(self, timeout_s: float) -> None:
        """After ``inbox.close()``: wait for the step in hand to end."""
        self._thread.join(timeout=timeout_s)
