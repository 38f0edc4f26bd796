"""A request held after its first tokens (``hold_after``, an early answer): it keeps its slot and
costs no step until released, then writes on to the very tokens an unheld request writes; a
request waiting behind it for the same session does not make the engine spin."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams
from tests.engine.conftest import GREEDY_PROMPTS

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


def test_a_held_request_waits_after_its_first_tokens_then_writes_on_as_an_unheld_one(fp32_engine):
    alone = fp32_engine.submit(GREEDY_PROMPTS[0], GREEDY)
    fp32_engine.run_until_idle()
    assert len(alone.output_ids) > 4

    held = fp32_engine.submit(GREEDY_PROMPTS[0], GREEDY, session="held", hold_after=3)
    other = fp32_engine.submit(GREEDY_PROMPTS[1], GREEDY)  # another stream is not held up by it
    fp32_engine.run_until_idle()
    assert other.finish_reason is not None and held.finish_reason is None
    (seq,) = [s for s in fp32_engine.scheduler.running if s.id == held.request_id]
    assert seq.is_held and seq.output_ids == alone.output_ids[:3]
    steps = fp32_engine.stats().steps
    fp32_engine.run_until_idle()  # nothing to do while it is held: no step
    assert fp32_engine.stats().steps == steps

    behind = fp32_engine.submit(GREEDY_PROMPTS[1], GREEDY, session="held")  # waits for the session's slot
    fp32_engine.run_until_idle()  # returns: the held request blocks it, no step spins on it
    assert behind.finish_reason is None and fp32_engine.stats().steps == steps

    held.release()
    fp32_engine.run_until_idle()
    assert held.finish_reason == alone.finish_reason and held.output_ids == alone.output_ids
    assert behind.finish_reason is not None  # admitted once the held request ended
    fp32_engine.drop_session("held")


def test_a_request_held_mid_answer_stops_at_once_then_writes_on_as_an_unheld_one(fp32_engine):
    """``stream.hold()`` (the first chunk's synthesis has the cores): no token after the step that
    takes it, no step while held; ``release()`` and the answer is the one an unheld request writes."""
    alone = fp32_engine.submit(GREEDY_PROMPTS[2], GREEDY)
    fp32_engine.run_until_idle()
    stream = fp32_engine.submit(GREEDY_PROMPTS[2], GREEDY)
    fp32_engine.step()  # admitted (from the inbox) and prefilled
    (seq,) = [s for s in fp32_engine.scheduler.running if s.id == stream.request_id]
    while len(seq.output_ids) < 4:
        fp32_engine.step()
    stream.hold()
    steps = fp32_engine.stats().steps
    fp32_engine.run_until_idle()
    assert len(seq.output_ids) == 4 and seq.is_held and stream.finish_reason is None
    assert fp32_engine.stats().steps == steps  # the hold was taken before any model step
    stream.release()
    fp32_engine.run_until_idle()
    assert stream.finish_reason == alone.finish_reason and stream.output_ids == alone.output_ids
    stream.release()  # a finished request: no effect


def test_a_held_request_is_cancelled_like_any_other_and_hold_after_is_checked(fp32_engine):
    held = fp32_engine.submit(GREEDY_PROMPTS[0], GREEDY, session="held-cancel", hold_after=2)
    fp32_engine.run_until_idle()
    held.cancel()
    fp32_engine.run_until_idle()
    assert held.finish_reason == "cancelled" and len(held.output_ids) == 2
    fp32_engine.drop_session("held-cancel")
    with pytest.raises(ValueError, match="hold_after"):
        fp32_engine.submit(GREEDY_PROMPTS[0], GREEDY, hold_after=0)


def thread_cpu_s(tid: int) -> float:
    """User + system CPU seconds of one thread of this process."""
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_engine_thread_sleeps_while_a_held_request_blocks_a_waiting_one(smollm2_dir):
    """With the background thread: a held request and one waiting behind it for the session take
    no step until the release; then both finish."""
    engine = LLMEngine(smollm2_dir, EngineConfig(quant="none", max_seq_len=512, num_slots=2, max_batch_size=2))
    try:
        held = engine.submit(GREEDY_PROMPTS[0], GREEDY, session="s", hold_after=2)
        for _ in range(3000):  # until it is held (bounded: a request that never holds fails below)
            if any(seq.is_held for seq in list(engine.scheduler.running)):
                break
            threading.Event().wait(0.01)
        behind = engine.submit(GREEDY_PROMPTS[1], GREEDY, session="s")
        steps, cpu_s = engine.stats().steps, thread_cpu_s(engine._step_thread._thread.native_id)
        threading.Event().wait(0.5)  # a spinning loop would burn most of this on a core; a sleeping one none
        assert thread_cpu_s(engine._step_thread._thread.native_id) - cpu_s < 0.2
        assert engine.stats().steps == steps and held.finish_reason is None and behind.finish_reason is None
        held.release()
        assert held.text() and behind.text()
        assert held.finish_reason in ("stop", "length") and behind.finish_reason in ("stop", "length")
    finally:
        engine.close()
