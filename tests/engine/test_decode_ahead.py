"""Greedy decode steps launched ahead (ModelRunner._decode_greedy, NativeDecoder::launch / complete): the
next step of a greedy batch starts on the step pool's helpers while the engine's Python puts the last
step's tokens out, and gives exactly the tokens of the step the engine would have run."""
from __future__ import annotations

import pytest
import torch

from engine import kernels as K
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams
from tests.engine.conftest import GREEDY_PROMPTS

PROMPTS = GREEDY_PROMPTS + [[{"role": "user", "content": "Count from one to ten."}]]


@pytest.fixture(scope="module")
def engine(smollm2_dir):
    assert K.load_kernels() is not None, K.unavailable_reason()
    engine = LLMEngine(smollm2_dir, EngineConfig(dtype="float32", quant="native", int16_activations=True,
                                                 max_seq_len=256, num_slots=8, max_batch_size=8,
                                                 admission_window_ms=0, num_threads=2), background=False)
    assert engine.runner.greedy_calls is not None
    yield engine
    engine.close()


class Calls:
    """Counts the greedy C calls: whole steps, launches, completes, and launched steps dropped."""

    def __init__(self, monkeypatch, greedy_calls):
        self.counts = {"step": 0, "launch": 0, "complete": 0, "dropped": 0}
        for name in ("step", "launch", "complete"):
            original = getattr(greedy_calls, name)

            def counted(*args, _name=name, _original=original):
                self.counts[_name] += 1
                return _original(*args)

            monkeypatch.setattr(greedy_calls, name, counted)
        settle = greedy_calls.settle

        def dropping():
            self.counts["dropped"] += greedy_calls.launched
            settle()

        monkeypatch.setattr(greedy_calls, "settle", dropping)


def _run(engine, ahead: bool, script=None, sampling=None, ignore_eos=True, prompts=PROMPTS):
    """The prompts decoded together; script(step, streams) may act between steps. -> the streams."""
    engine.runner.goes_on = engine.outputs.goes_on if ahead else None
    try:
        streams = [engine.submit(p, sampling or SamplingParams(temperature=0.0, max_tokens=24), ignore_eos=ignore_eos)
                   for p in prompts]
        step = 0
        while engine.has_work:
            if script is not None:
                script(step, streams)
            engine.step()
            step += 1
        engine.runner.expect_step(False)
        return streams
    finally:
        engine.runner.goes_on = engine.outputs.goes_on


def test_launched_steps_give_the_tokens_of_the_steps_run_one_by_one(engine, monkeypatch):
    alone = [s.output_ids for s in _run(engine, ahead=False)]
    calls = Calls(monkeypatch, engine.runner.greedy_calls)
    ahead = [s.output_ids for s in _run(engine, ahead=True)]
    assert ahead == alone and all(len(ids) == 24 for ids in ahead)
    # The first decode step runs whole; each later one was launched by the one before (the last step's
    # tokens end every sequence on its limit: nothing is launched after it).
    assert calls.counts == {"step": 1, "launch": 22, "complete": 22, "dropped": 0}
    assert not engine.runner.decoder.launched()


def test_a_sequence_that_ends_unforeseen_leaves_the_others_their_rows(engine, monkeypatch):
    """A cancel (like a stop string) ends a sequence after the next step was launched with it: the others
    take their rows of that step."""
    def cancel_one(step, streams):
        if step == 6:
            streams[1].cancel()

    alone = [s.output_ids for s in _run(engine, ahead=False, script=cancel_one)]
    calls = Calls(monkeypatch, engine.runner.greedy_calls)
    ahead = [s.output_ids for s in _run(engine, ahead=True, script=cancel_one)]
    assert ahead == alone and len(ahead[1]) < 24 and len(ahead[0]) == 24
    assert calls.counts["step"] == 1 and calls.counts["complete"] == 22 and calls.counts["dropped"] == 0


def test_an_arrival_drops_the_launched_step(engine, monkeypatch):
    """A prompt arriving during decoding: the step launched ahead is completed and dropped before the
    admission (which may copy into the cache), and the arrival's step runs as without launches."""
    late = []

    def arrive(step, streams):
        if step == 5:
            late.append(engine.submit(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=10), ignore_eos=True))

    alone = [s.output_ids for s in _run(engine, ahead=False, script=arrive)] + [late.pop().output_ids]
    calls = Calls(monkeypatch, engine.runner.greedy_calls)
    ahead = [s.output_ids for s in _run(engine, ahead=True, script=arrive)] + [late.pop().output_ids]
    assert ahead == alone
    assert calls.counts["dropped"] == 1  # the one launched before the arrival (completed, its rows unused)
    assert calls.counts["launch"] == calls.counts["complete"] > 1


def test_nothing_is_launched_past_an_end_of_turn(engine, monkeypatch):
    """Without ignore_eos an end-of-turn token ends the sequence: no step is launched after it."""
    calls = Calls(monkeypatch, engine.runner.greedy_calls)
    streams = _run(engine, ahead=True, ignore_eos=False, prompts=PROMPTS[:1],
                   sampling=SamplingParams(temperature=0.0, max_tokens=200))
    assert streams[0].finish_reason == "stop" and len(streams[0].output_ids) < 200
    assert calls.counts["launch"] == calls.counts["complete"] > 0 and calls.counts["dropped"] == 0


def test_launch_and_complete_equal_one_step(engine):
    """NativeDecoder: launch then complete gives step()'s logits; step() after a launch completes the
    launched step first (dropped); complete without a launch raises."""
    decoder = engine.runner.decoder
    inputs = (torch.tensor([5, 6, 7]), torch.tensor([0, 0, 0]), torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2]))
    want = decoder.step(*inputs)
    decoder.launch(*inputs)
    assert decoder.launched()
    got = decoder.complete()
    assert torch.equal(got, want) and not decoder.launched()
    decoder.launch(*inputs)
    assert torch.equal(decoder.step(*inputs), want) and not decoder.launched()
    with pytest.raises(RuntimeError, match="no launched step"):
        decoder.complete()
