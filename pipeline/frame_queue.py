"""``FrameQueue``: a bounded FIFO of frames between threads that an interruption can purge in place.

Each stage's in-queue and the pipeline's output queue are one; purging under the queue's own lock
means a frame is either gone or delivered, never both.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Callable


class FrameQueue:
    """Frames (or a stop sentinel) in arrival order, at most ``maxsize`` of them."""

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._items: deque = deque()
        self._changed = threading.Condition()

    def put(self, item) -> None:
        """Appends, waiting while the queue is full (backpressure on the sender)."""
        with self._changed:
            self._changed.wait_for(lambda: len(self._items) < self.maxsize)
            self._items.append(item)
            self._changed.notify_all()

    def offer(self, item) -> bool:
        """Appends without waiting; False (and the item is not taken) when the queue is full."""
        with self._changed:
            if len(self._items) >= self.maxsize:
                return False
            self._items.append(item)
            self._changed.notify_all()
            return True

    def put_dropping_oldest(self, item) -> None:
        """Appends without waiting: when full, the oldest item makes room (nobody is reading)."""
        with self._changed:
            while len(self._items) >= self.maxsize:
                self._items.popleft()
            self._items.append(item)
            self._changed.notify_all()

    def get(self, timeout: float | None = None):
        """The oldest item, waiting for one; None after ``timeout`` seconds."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._items, timeout):
                return None
            item = self._items.popleft()
            self._changed.notify_all()
            return item

    def purge(self, drop: Callable[[object], bool], prepare: Callable[[deque], None] | None = None) -> None:
        """Removes the queued items ``drop`` selects. ``prepare`` sees the queue first, under the
        same lock (a stage re-labels frames it must keep before the purge decides)."""
        with self._changed:
            if prepare is not None:
                prepare(self._items)
            kept = [item for item in self._items if not drop(item)]
            self._items.clear()
            self._items.extend(kept)
            self._changed.notify_all()

    def replace_all(self, item) -> None:
        """Everything queued is dropped and ``item`` (a stop sentinel) is next, even when full."""
        with self._changed:
            self._items.clear()
            self._items.append(item)
            self._changed.notify_all()

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items
