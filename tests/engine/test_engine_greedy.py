"""Greedy equivalences in exact (fp32) mode: cache reuse, batching and chunking change nothing."""
from __future__ import annotations

import pytest

from engine.sampling_params import SamplingParams
from tests.engine.conftest import GREEDY_PROMPTS

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


def _run_alone(engine, prompt, sampling=GREEDY, session=None):
    stream = engine.submit(prompt, sampling, session=session)
    engine.run_until_idle()
    return stream


def test_greedy_matches_transformers_generate(fp32_engine, hf_model):
    import torch

    ids = fp32_engine.encode(GREEDY_PROMPTS[0])
    with torch.inference_mode():
        out = hf_model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, pad_token_id=2)
    expected = [t for t in out[0, len(ids):].tolist() if t != 2]
    stream = _run_alone(fp32_engine, GREEDY_PROMPTS[0])
    assert stream.output_ids == expected[: len(stream.output_ids)]
    assert stream.text() == fp32_engine.tokenizer.decode(expected, skip_special_tokens=True)


def test_batched_decode_equals_unbatched(fp32_engine):
    alone = [_run_alone(fp32_engine, p).output_ids for p in GREEDY_PROMPTS]
    streams = [fp32_engine.submit(p, GREEDY) for p in GREEDY_PROMPTS]
    fp32_engine.run_until_idle()
    assert [s.output_ids for s in streams] == alone
    assert all(len(ids) > 3 for ids in alone)


def test_packed_prefill_equals_separate_prefills(fp32_engine):
    """Prompts prefilled together in one packed forward (one fresh, one continuing a cached prefix,
    one in a slot with a hole before it) give the logits and cache contents of separate prefills."""
    import torch

    runner, cache = fp32_engine.runner, fp32_engine.kv_cache.tensors
    a, b, c = (fp32_engine.encode(p) for p in GREEDY_PROMPTS)
    with torch.inference_mode():
        runner.prefill(3, b[:10], 0, want_logits=False)  # b's cached prefix, in both layouts
        runner.prefill(7, b[:10], 0, want_logits=False)
        together = runner.prefill_many([(2, a, 0, True), (3, b[10:], 10, True), (5, c, 0, False)])
        alone = [runner.prefill(6, a, 0), runner.prefill(7, b[10:], 10)]
        runner.prefill(4, c, 0, want_logits=False)
    for slot in range(2, 8):  # written behind the slots' bookkeeping: whoever owns one re-prefills
        fp32_engine.kv_cache.slots[slot].tokens = []
    assert together[2] is None
    for got, expected in zip(together[:2], alone):
        assert (got - expected).abs().max().item() < 1e-4
        assert torch.equal(got.argmax(), expected.argmax())
    for packed_slot, alone_slot, length in ((2, 6, len(a)), (3, 7, len(b)), (5, 4, len(c))):
        diff = (cache.k[:, packed_slot, :, :length] - cache.k[:, alone_slot, :, :length]).abs().max().item()
        assert diff < 1e-4, (packed_slot, diff)


def test_prompts_arriving_together_share_a_prefill_step(fp32_engine):
    streams = [fp32_engine.submit(p, GREEDY) for p in GREEDY_PROMPTS]
    steps_before = fp32_engine.stats().steps
    fp32_engine.step()  # admits all three and prefills them in one forward
    assert all(s.ttft_s is not None for s in streams)  # each has its first token
    assert fp32_engine.stats().steps == steps_before + 1
    fp32_engine.run_until_idle()


def test_batch_with_slot_holes_equals_unbatched(fp32_engine):
    """Sessions pin slots 0..2; new requests then sit in non-consecutive slots (gathered rows)."""
    for i in range(3):
        _run_alone(fp32_engine, GREEDY_PROMPTS[0], session=f"pin-{i}")
    alone = [_run_alone(fp32_engine, p).output_ids for p in GREEDY_PROMPTS]
    streams = [fp32_engine.submit(GREEDY_PROMPTS[0], GREEDY, session="pin-1")]  # slot 1 again
    streams += [fp32_engine.submit(p, GREEDY) for p in GREEDY_PROMPTS]
    fp32_engine.run_until_idle()
    assert [s.output_ids for s in streams[1:]] == alone
    for i in range(3):
        fp32_engine.drop_session(f"pin-{i}")


def test_chunked_prefill_equals_one_chunk(fp32_engine):
    prompt = GREEDY_PROMPTS[2]
    whole = _run_alone(fp32_engine, prompt).output_ids
    fp32_engine.scheduler.prefill_chunk_tokens = 7
    try:
        chunked = _run_alone(fp32_engine, prompt).output_ids
    finally:
        fp32_engine.scheduler.prefill_chunk_tokens = fp32_engine.config.prefill_chunk_tokens
    assert chunked == whole


def test_session_reuses_cache_and_equals_full_prefill(fp32_engine):
    history = [{"role": "system", "content": "You are a helpful voice assistant."}]
    for turn, question in enumerate(["Hi! Who are you?", "What is two plus two?", "And three plus three?"]):
        history.append({"role": "user", "content": question})
        kept = _run_alone(fp32_engine, history, session="conversation")
        fresh = _run_alone(fp32_engine, history)  # no session: full prefill in a clean slot
        assert kept.output_ids == fresh.output_ids
        if turn > 0:  # everything up to the new user message came from the cache
            assert kept.cached_tokens > 0.6 * kept.prompt_tokens
        history.append({"role": "assistant", "content": kept.text()})
    # Trimmed history (first exchange dropped): only the common prefix (the system prompt) is reused.
    trimmed = history[:1] + history[3:]
    kept = _run_alone(fp32_engine, trimmed, session="conversation")
    assert 0 < kept.cached_tokens < kept.prompt_tokens // 2
    assert kept.output_ids == _run_alone(fp32_engine, trimmed).output_ids
    fp32_engine.drop_session("conversation")


def test_reclaimed_session_slot_falls_back_to_full_prefill(fp32_engine):
    engine = fp32_engine
    prompt = [{"role": "user", "content": "Say hello."}]
    _run_alone(engine, prompt, session="old")
    for i in range(len(engine.kv_cache.slots)):  # more sessions than slots: "old" is the LRU victim
        _run_alone(engine, [{"role": "user", "content": f"Number {i}"}], SamplingParams(temperature=0, max_tokens=1),
                   session=f"filler-{i}")
    again = _run_alone(engine, prompt, session="old")
    assert again.cached_tokens == 0
    assert again.output_ids == _run_alone(engine, prompt).output_ids
    for i in range(len(engine.kv_cache.slots)):
        engine.drop_session(f"filler-{i}")
    engine.drop_session("old")
    assert engine.kv_cache.num_sessions == 0


@pytest.mark.parametrize("prompt_kind", ["ids", "text"])
def test_prompt_forms(fp32_engine, prompt_kind):
    ids = fp32_engine.encode(GREEDY_PROMPTS[0])
    prompt = ids if prompt_kind == "ids" else fp32_engine.tokenizer.decode(ids)
    assert _run_alone(fp32_engine, prompt).output_ids == _run_alone(fp32_engine, GREEDY_PROMPTS[0]).output_ids


def test_a_prompt_arriving_mid_decode_shares_the_step_and_changes_nothing(fp32_engine, monkeypatch):
    """The fp32 engine's one native call: a prompt submitted while others decode is prefilled in the
    same call as their decode rows (greedy: runner._run_greedy, one C call of all the rows), and every
    answer is the one it gets alone."""
    alone = [_run_alone(fp32_engine, p).output_ids for p in GREEDY_PROMPTS]
    mixed_calls = []
    runner = fp32_engine.runner
    original, rows = runner._run_greedy, runner.step_calls.rows

    def counting(chunks, plan, result):
        calls = len(native_calls)
        out = original(chunks, plan, result)
        if chunks and plan.decode:
            mixed_calls.append((len(chunks), len(plan.decode), len(native_calls) - calls))
        return out

    native_calls = []
    monkeypatch.setattr(runner, "_run_greedy", counting)
    monkeypatch.setattr(runner.step_calls, "rows", lambda *args: native_calls.append(1) or rows(*args))
    first = [fp32_engine.submit(p, GREEDY) for p in GREEDY_PROMPTS[:2]]
    for _ in range(3):
        fp32_engine.step()
    late = fp32_engine.submit(GREEDY_PROMPTS[2], GREEDY)
    fp32_engine.run_until_idle()
    assert [s.output_ids for s in first + [late]] == alone
    assert mixed_calls and mixed_calls[0] == (1, 2, 1)


def test_the_engine_says_after_each_step_whether_another_follows(fp32_engine, monkeypatch):
    """After every step the engine tells the runner whether another follows at once, so that the one-call
    step's helper threads are awake for it (``NativeDecoder.expect_step``; they sleep after a spin shorter
    than the engine's Python between two steps): yes after each step of a request but its last, then no
    (they may sleep: no spinning while the engine is idle). The first step after idling says yes at its
    start too: the helpers wake while its Python runs (a prompt's TTFT counts from its submit)."""
    calls = []
    expect_step = fp32_engine.runner.expect_step
    monkeypatch.setattr(fp32_engine.runner, "expect_step", lambda follows: (calls.append(follows), expect_step(follows)))
    stream = fp32_engine.submit(GREEDY_PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=4), ignore_eos=True)
    fp32_engine.run_until_idle()
    assert len(stream.output_ids) == 4
    # woken at the prompt's step's start, then after it (first token) and 3 decode steps
    assert calls == [True, True, True, True, False]


def test_a_prompt_after_idling_finds_the_helper_awake(fp32_engine, monkeypatch):
    """A request reaching an idle engine: the native step's helper thread slept (no step was expected), and
    the prompt's step woke it, so the helper joined late (its first phases on one thread), on every TTFT.
    The step's start wakes it (``expect_step``) while the engine's Python runs: no prompt step begins with
    the helper asleep (the step pool's profile counts the steps a helper slept through the start of)."""
    import time

    import torch

    import engine.runner as runner_module

    decoder = fp32_engine.runner.decoder
    assert decoder is not None
    # On a busy machine a woken thread may wait a while for a CPU: the engine's Python before the native
    # call made 20 ms longer, and the helper kept awake (spinning) for 500 ms instead of 2.
    monkeypatch.setattr(runner_module, "EXPECT_STEP_US", 500_000)
    run = fp32_engine.runner.run
    monkeypatch.setattr(fp32_engine.runner, "run", lambda plan: (time.sleep(0.02), run(plan))[1])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        decoder.set_stall_fallback(False)  # really two threads, even on a busy machine
        _run_alone(fp32_engine, GREEDY_PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=1))  # the helper exists
        asleep = 0
        for prompt in GREEDY_PROMPTS:
            time.sleep(0.005)  # idle: 100x the helper's spin after a step, so it sleeps
            decoder.set_profiling(True)
            stream = _run_alone(fp32_engine, prompt, SamplingParams(temperature=0.0, max_tokens=1))
            asleep += decoder.handoff_profile()[4 + 7 + 6]  # worker 1's steps begun asleep
            decoder.set_profiling(False)
            assert len(stream.output_ids) == 1
        assert asleep == 0
    finally:
        decoder.set_stall_fallback(True)
        torch.set_num_threads(threads)
