"""The Stage base: system frames overtake busy stages, interrupts drop old queued data, and an
exception becomes an ErrorFrame without killing the stage."""
from __future__ import annotations

import queue
import threading

from pipeline.frames import ErrorFrame, Interrupt, TextIn
from pipeline.stage import Stage


class Slow(Stage):
    name = "slow"

    def __init__(self):
        super().__init__()
        self.release = threading.Event()
        self.started = threading.Event()
        self.seen: list[str] = []

    def process(self, frame):
        if frame.text == "block":
            self.started.set()
            self.release.wait(10)
        if frame.text == "boom":
            raise RuntimeError("exploded")
        self.seen.append(frame.text)
        yield frame


def wired(stage: Stage) -> queue.Queue:
    out: queue.Queue = queue.Queue()
    stage.connect(out.put)
    stage.start()
    return out


def test_system_frame_passes_a_busy_stage_and_old_data_is_dropped():
    stage = Slow()
    out = wired(stage)
    stage.put(TextIn(gen=1, text="block"))
    stage.put(TextIn(gen=1, text="old"))
    assert stage.started.wait(5)
    stage.put(Interrupt(gen=2))
    assert isinstance(out.get(timeout=5), Interrupt)  # delivered while "block" still holds the thread
    stage.put(TextIn(gen=2, text="new"))
    stage.release.set()
    assert out.get(timeout=5).text == "new"  # "block" (now stale) is not emitted, "old" never processed
    assert stage.seen == ["block", "new"]
    assert stage.stop()


def test_exception_becomes_error_frame_and_the_stage_goes_on():
    stage = Slow()
    out = wired(stage)
    stage.put(TextIn(gen=1, text="boom"))
    stage.put(TextIn(gen=2, text="fine"))
    error = out.get(timeout=5)
    assert isinstance(error, ErrorFrame) and error.gen == 1 and "exploded" in error.detail
    assert out.get(timeout=5).text == "fine"
    assert stage.stop()
