"""Admission, cancellation, stop conditions and slot bookkeeping of the scheduler and step loop."""
from __future__ import annotations

import gc

import psutil

from engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)
SHORT_PROMPT = [1, 9690, 198, 2683, 314, 346, 47, 2, 198, 1, 4093, 198]  # a few ChatML-ish ids


def _idle(engine) -> bool:
    return (not engine.scheduler.waiting and not engine.scheduler.running and engine.kv_cache.num_busy == 0
            and engine.num_open_requests == 0)


def test_max_batch_size_limits_running_and_the_rest_waits(int8_engine):
    engine = int8_engine
    engine.scheduler.max_batch_size = 3
    try:
        streams = [engine.submit(SHORT_PROMPT, GREEDY) for _ in range(5)]
        engine.step()
        assert len(engine.scheduler.running) == 3 and len(engine.scheduler.waiting) == 2
        assert engine.stats().waiting == 2 and engine.stats().slots_busy == 3
        engine.run_until_idle()
    finally:
        engine.scheduler.max_batch_size = engine.config.max_batch_size
    assert all(s.finish_reason == "length" and len(s.output_ids) == 6 for s in streams)
    assert _idle(engine)


def test_new_request_joins_running_batch_between_steps(int8_engine):
    engine = int8_engine
    first = engine.submit(SHORT_PROMPT, SamplingParams(temperature=0, max_tokens=8))
    engine.step()  # prefill + first token
    engine.step()
    second = engine.submit(SHORT_PROMPT, SamplingParams(temperature=0, max_tokens=8))
    engine.step()  # second is prefilled while first decodes
    assert len(engine.scheduler.running) == 2
    seq_first, seq_second = engine.scheduler.running
    assert len(seq_first.output_ids) == 3 and len(seq_second.output_ids) == 1
    engine.run_until_idle()
    assert first.output_ids == second.output_ids  # same prompt, greedy: joining mid-way changes nothing
    assert _idle(engine)


def test_long_prefill_is_chunked_and_running_streams_keep_decoding(int8_engine):
    engine = int8_engine
    engine.scheduler.prefill_chunk_tokens = 16
    try:
        running = engine.submit(SHORT_PROMPT, SamplingParams(temperature=0, max_tokens=20), ignore_eos=True)
        engine.step()
        long_prompt = SHORT_PROMPT * 8  # 96 tokens -> 6 chunks
        late = engine.submit(long_prompt, SamplingParams(temperature=0, max_tokens=2))
        tokens_before = engine.stats().tokens_generated
        for _ in range(6):
            engine.step()
            assert engine.scheduler.running[-1].num_cached <= len(long_prompt)
        # six steps: the long prompt got one chunk per step, the running stream one token per step
        assert engine.stats().tokens_generated - tokens_before >= 6
        engine.run_until_idle()
    finally:
        engine.scheduler.prefill_chunk_tokens = engine.config.prefill_chunk_tokens
    assert len(running.output_ids) == 20 and late.finish_reason in ("length", "stop")
    assert _idle(engine)


def test_prompts_share_the_step_prefill_budget_oldest_first(int8_engine):
    """Three 12-token prompts, a budget of 16 tokens per step: step 1 prefills the first whole and
    4 of the second, step 2 the rest of the second and 8 of the third, step 3 the rest of the third."""
    engine = int8_engine
    engine.scheduler.prefill_chunk_tokens = 16
    try:
        streams = [engine.submit(SHORT_PROMPT, SamplingParams(temperature=0, max_tokens=4)) for _ in range(3)]
        cached = []
        for _ in range(3):
            engine.step()
            cached.append([seq.num_cached if seq.is_prefilling else "done" for seq in engine.scheduler.running])
        engine.run_until_idle()
    finally:
        engine.scheduler.prefill_chunk_tokens = engine.config.prefill_chunk_tokens
    assert cached == [["done", 4, 0], ["done", "done", 8], ["done", "done", "done"]]
    assert streams[0].output_ids == streams[1].output_ids == streams[2].output_ids  # same prompt, greedy
    assert _idle(engine)


def test_cancel_takes_effect_at_next_step_and_frees_the_slot(int8_engine):
    engine = int8_engine
    stream = engine.submit(SHORT_PROMPT, SamplingParams(temperature=0, max_tokens=200), ignore_eos=True)
    engine.step()
    engine.step()
    assert engine.kv_cache.num_busy == 1
    stream.cancel()
    engine.step()
    assert engine.kv_cache.num_busy == 0 and stream.finish_reason == "cancelled"
    assert _idle(engine)
    assert 0 < len(stream.output_ids) <= 3


def test_cancel_of_a_waiting_request(int8_engine):
    engine = int8_engine
    stream = engine.submit(SHORT_PROMPT, GREEDY)
    engine.cancel(stream.request_id)
    engine.step()
    assert stream.finish_reason == "cancelled" and stream.output_ids == []
    assert _idle(engine)


def test_thousand_submit_cancel_cycles_leave_nothing_behind(int8_engine):
    engine = int8_engine
    process = psutil.Process()

    def cycles(n):
        for _ in range(n // 8):
            streams = [engine.submit(SHORT_PROMPT[:4], GREEDY) for _ in range(8)]
            engine.step()  # admitted, first one prefilled
            for stream in streams:
                stream.cancel()
            engine.step()
            assert all(s.finish_reason in ("cancelled", "length", "stop") for s in streams)

    cycles(96)  # warm up allocator pools before measuring
    gc.collect()
    rss_before = process.memory_info().rss
    cycles(1000)
    gc.collect()
    assert _idle(engine) and engine.kv_cache.num_sessions == 0
    assert not engine.sampler.generators
    assert process.memory_info().rss - rss_before < 50 * 2**20


def test_max_tokens_and_end_of_turn_and_stop_strings(fp32_engine):
    engine = fp32_engine
    prompt = [{"role": "user", "content": "What is the capital of France?"}]
    full = engine.submit(prompt, SamplingParams(temperature=0, max_tokens=64))
    engine.run_until_idle()
    text = full.text()
    assert full.finish_reason == "stop" and 2 not in full.output_ids  # ended by <|im_end|>, not emitted
    limited = engine.submit(prompt, SamplingParams(temperature=0, max_tokens=3))
    engine.run_until_idle()
    assert limited.finish_reason == "length" and len(limited.output_ids) == 3
    word = text.split()[2]  # stop at the third word: text before it only, stop string not included
    stopped = engine.submit(prompt, SamplingParams(temperature=0, max_tokens=64, stop=(word,)))
    engine.run_until_idle()
    assert stopped.finish_reason == "stop"
    assert stopped.text() == text[: text.index(word)]


def test_background_thread_streams_and_cancels(smollm2_dir):
    import threading
    import time

    from engine.config import EngineConfig
    from engine.engine import LLMEngine

    engine = LLMEngine(smollm2_dir, EngineConfig(max_seq_len=256, num_slots=2, max_batch_size=2))
    try:
        answers = []
        threads = [threading.Thread(target=lambda: answers.append(
            engine.generate([{"role": "user", "content": "Say hi."}], SamplingParams(temperature=0, max_tokens=5))))
            for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(answers) == 2 and answers[0] == answers[1] and answers[0]
        stream = engine.submit([{"role": "user", "content": "Count to one hundred."}],
                               SamplingParams(temperature=0, max_tokens=200), ignore_eos=True)
        first = next(iter(stream))
        stream.cancel()
        rest = list(stream)
        assert first and stream.finish_reason == "cancelled" and len(rest) < 10
        deadline = time.time() + 10
        while engine.stats().slots_busy and time.time() < deadline:
            time.sleep(0.01)
        assert engine.stats().slots_busy == 0 and engine.stats().tokens_generated > 0
    finally:
        engine.close()


def test_background_engine_builds_in_its_thread_and_reports_failures(smollm2_dir, tmp_path):
    """The stepping thread also builds the model (one OpenMP team in the process); a build that
    fails there raises from the constructor and leaves no thread behind."""
    import threading

    import pytest

    from engine.config import EngineConfig
    from engine.engine import LLMEngine

    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):  # all but the weights
        if (smollm2_dir / name).exists():
            (tmp_path / name).write_text((smollm2_dir / name).read_text())
    before = threading.active_count()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        LLMEngine(tmp_path, EngineConfig(max_seq_len=64, num_slots=1, max_batch_size=1))
    assert threading.active_count() == before
