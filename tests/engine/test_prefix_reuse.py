"""Prefills hidden before the answer: a persona's system prompt computed once for every session
(a read-only shared prefix, copied into each slot), and the user's partial transcripts prefilled
into the session's slot while they speak. Either way the slot must end up as a fresh prefill of the
final prompt would leave it, and the answer must be the same."""
from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.sampling_params import SamplingParams

SYSTEM = "You are Nova, a friendly voice assistant. Answer in one short spoken sentence."
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


@pytest.fixture(scope="module")
def engine(smollm2_dir) -> LLMEngine:
    """Exact mode (fp32 weights and KV cache), so a reused prefix and a fresh prefill can be compared closely
    (an fp16 cache rounds a few elements of the two to neighbouring halves: tests/engine/test_kv_fp16.py)."""
    engine = LLMEngine(smollm2_dir, EngineConfig(quant="none", kv_cache_dtype="float32", max_seq_len=256, num_slots=6,
                                                 max_batch_size=4, num_shared_prefixes=2, admission_window_ms=0),
                       background=False)
    yield engine
    engine.close()


def run(engine: LLMEngine, prompt, session=None, **kwargs):
    stream = engine.submit(prompt, GREEDY, session=session, **kwargs)
    engine.run_until_idle()
    return stream


def fresh_answer(engine: LLMEngine, messages) -> list[int]:
    """The reference: the same prompt in a slot that shares nothing (no session, shared rows ignored)."""
    saved, engine.kv_cache.prefixes = engine.kv_cache.prefixes, {}
    try:
        stream = run(engine, messages)
        assert stream.cached_tokens == 0
        return stream.output_ids
    finally:
        engine.kv_cache.prefixes = saved


def assert_slot_is_a_fresh_prefill(engine: LLMEngine, session: str, prompt_ids: list[int]) -> None:
    """The session's slot holds exactly ``prompt_ids`` (then its answer), with the k/v a fresh
    prefill of them writes into an unused row."""
    slot = engine.kv_cache._by_session[session]
    assert slot.tokens[: len(prompt_ids)] == prompt_ids
    spare = next(s.index for s in engine.kv_cache.slots if s.session is None and not s.is_busy)
    engine.runner.prefill(spare, prompt_ids, 0, want_logits=False)
    n = len(prompt_ids)
    k, v = engine.kv_cache.tensors.k, engine.kv_cache.tensors.v
    assert torch.allclose(k[:, slot.index, :, :n], k[:, spare, :, :n], atol=1e-4)
    assert torch.allclose(v[:, slot.index, :, :n], v[:, spare, :, :n], atol=1e-4)


def test_a_shared_system_prompt_is_computed_once_for_every_session(engine):
    prefix_ids = engine.system_prefix_ids(SYSTEM)
    before = engine.num_prefix_prefills
    for _ in range(2):  # asked twice (two sessions starting): computed once
        done = engine.share_prefix(prefix_ids)
        engine.run_until_idle()
        assert done.is_set()
    assert engine.num_prefix_prefills == before + 1
    prefix = engine.kv_cache.prefixes[tuple(prefix_ids)]
    for i, question in enumerate(("What is the capital of France?", "Name a colour.", "Say hello to Maria.")):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        stream = run(engine, messages, session=f"shared-{i}")
        assert stream.cached_tokens == len(prefix_ids)  # copied, not recomputed
        assert stream.output_ids == fresh_answer(engine, messages)
        assert_slot_is_a_fresh_prefill(engine, f"shared-{i}", engine.encode(messages))
    assert prefix.num_copies == 3 and engine.num_prefix_prefills == before + 1
    for i in range(3):
        engine.drop_session(f"shared-{i}")


def test_partial_transcripts_prefilled_while_speaking_leave_the_slot_as_a_fresh_prefill(engine):
    # What a speaking user's partial transcripts look like, including a word Whisper revised.
    partials = ["What is the", "What is the capitol", "What is the capital of", "What is the capital of France"]
    for text in partials:
        ids = engine.encode_open_user_turn([{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}])
        probe = run(engine, ids, session="talk", probe_ids=frozenset())
        assert probe.finish_reason == "probed"
    final = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is the capital of France?"}]
    answer = run(engine, final, session="talk")
    last_partial = engine.encode_open_user_turn([{"role": "system", "content": SYSTEM},
                                                 {"role": "user", "content": partials[-1]}])
    # Only the words after the last partial (here "?" and the assistant header) were prefilled at the end.
    assert answer.cached_tokens >= len(last_partial) - 1
    assert len(engine.encode(final)) - answer.cached_tokens <= 8
    assert answer.output_ids == fresh_answer(engine, final)
    assert_slot_is_a_fresh_prefill(engine, "talk", engine.encode(final))
    engine.drop_session("talk")
