"""A fault one request causes ends that request only (issue 11, finding 1): a seed that torch's
generator refuses used to raise on the engine thread and end every request in flight."""
from __future__ import annotations

import pytest

from engine.sampling_params import SamplingParams

PROMPT = [{"role": "user", "content": "Count from one to twenty in words."}]


def poisoned(sampling: SamplingParams) -> SamplingParams:
    """Settings the API edge now refuses, forced past validation to reach the engine thread."""
    object.__setattr__(sampling, "seed", 2**64)  # torch: "Overflow when unpacking long long"
    return sampling


def test_a_poisoned_request_ends_alone_and_the_batch_goes_on(int8_engine):
    engine = int8_engine
    good = [engine.submit(PROMPT, SamplingParams(temperature=0.0, max_tokens=24)) for _ in range(2)]
    sampled = engine.submit(PROMPT, SamplingParams(temperature=0.8, seed=7, max_tokens=24))
    engine.run_until_idle(max_steps=3)  # the three are decoding together
    bad = engine.submit(PROMPT, poisoned(SamplingParams(temperature=0.8, max_tokens=24)))
    engine.run_until_idle()
    for stream in (*good, sampled):
        assert stream.finish_reason in ("stop", "length") and stream.output_ids, stream.finish_reason
        assert stream.text()
    assert bad.finish_reason == "error"
    with pytest.raises(Exception, match="Overflow"):  # torch's own error, delivered to this stream alone
        bad.text()
    assert good[0].output_ids == good[1].output_ids  # greedy rows were not disturbed
    assert engine.num_open_requests == 0 and engine.kv_cache.num_busy == 0


def test_seed_and_stops_are_checked_where_settings_are_made():
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed=2**64)
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed=-1)
    SamplingParams(seed=2**63 - 1)
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=("a",) * 5)
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=("x" * 65,))
