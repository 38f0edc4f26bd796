"""A prompt's fp16 keys and values widened once (engine/decode_step.cpp's StepWork::find_runs, widen_runs) on
two threads: their fp32 buffer is the decoder's, grown and kept between steps (a prompt step allocated its
own before), and the widened-key counts, per worker and summed after each step (a shared atomic that both
threads' tasks bumped before), are the same on one thread and on two, with logits and cache bit-equal."""
from __future__ import annotations

import pytest
import torch

from tests.engine.test_last_rows import assert_bit_equal, prompt
from tests.engine.test_native_weights import ops, smollm2_native  # noqa: F401 (fixtures)
from tests.engine.test_widen_once import CASES


def on_threads(threads: int, f):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return f()
    finally:
        torch.set_num_threads(before)


def test_widened_key_buffer_is_kept(ops, smollm2_native):
    """Two 43-token prompts allocate the fp32 keys' buffer once; a chunk whose run has more keys (64) grows
    it; a shorter prompt after it does not."""
    from engine.kv_cache import KVCache
    from engine.native_step import build_decoder

    cache = KVCache(smollm2_native.args, 2, 256, torch.float16)
    decoder = build_decoder(smollm2_native, cache.tensors)
    assert decoder.kv32_allocations() == 0
    decoder.step(*prompt(43, 0, 0, [42]))
    decoder.step(*prompt(43, 1, 0, [42], seed=1))
    assert decoder.kv32_allocations() == 1
    decoder.step(*prompt(21, 1, 43, [20], seed=2))
    assert decoder.kv32_allocations() == 2
    decoder.step(*prompt(40, 0, 0, [39], seed=3))
    assert decoder.kv32_allocations() == 2


@pytest.mark.parametrize("case", list(CASES))
def test_two_threads_widen_and_count_as_one(ops, smollm2_native, case):
    """The same logits, cache and widened-key count on two threads (each worker counting its own) as on one."""
    from engine.kv_cache import KVCache
    from engine.native_step import build_decoder

    def run(threads: int):
        def go():
            cache = KVCache(smollm2_native.args, 4, 320, torch.float16)
            cache.tensors.k.zero_(), cache.tensors.v.zero_()
            decoder = build_decoder(smollm2_native, cache.tensors)
            decoder.set_stall_fallback(False)
            logits = [decoder.step(*args) for args in CASES[case]]
            return (logits, cache.tensors.k.clone(), cache.tensors.v.clone()), decoder.widened_keys()
        return on_threads(threads, go)

    (one, widened_one), (two, widened_two) = run(1), run(2)
    assert_bit_equal([one, two])
    assert widened_two == widened_one > 0


@pytest.mark.parametrize("threads", [1, 2])
def test_widened_keys_counted_per_worker(ops, smollm2_native, threads):
    """test_widen_once's counts of a 43-token prompt on one thread and on two."""
    from engine.kv_cache import KVCache
    from engine.native_step import build_decoder

    a = smollm2_native.args

    def go():
        for once, per_head in ((True, 43), (False, 16 + 32 + 43)):
            cache = KVCache(a, 2, 128, torch.float16)
            decoder = build_decoder(smollm2_native, cache.tensors)
            decoder.set_stall_fallback(False)
            decoder.set_widen_once(once)
            decoder.step(*prompt(43, 1, 0, list(range(43))))
            assert decoder.widened_keys() == a.num_layers * a.num_kv_heads * per_head

    on_threads(threads, go)
