"""A prompt chunk's intermediates that no other phase reads, in the worker's own scratch (engine/decode_step.cpp's
NativeDecoder::ActScratch) instead of the step's shared buffers, where int16 activations make the next matrix
read only their int16 blocks: a gate/up task's gate and up outputs and silu(gate) * up (StepWork::act_local,
set_act_scratch; down reads only acti), an attention task's outputs (StepWork::attn_local, set_attn_scratch;
o_proj reads only attni). The logits and the cache bit-equal to the shared buffers' (the switch off, as before),
on one thread and on two; the other activations, and decoding batches, keep the shared buffers."""
from __future__ import annotations

import pytest
import torch

from tests.engine.test_last_rows import ACTIVATIONS, CASES, assert_bit_equal, prompt, run_both, set_activations
from tests.engine.test_native_weights import ops, smollm2_native  # noqa: F401 (fixtures)
from tests.engine.test_widened_keys_buffer import on_threads

SWITCHES = ["act_scratch", "attn_scratch"]


@pytest.mark.parametrize("switch", SWITCHES)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", ACTIVATIONS)
@pytest.mark.parametrize("case", ["one row", "more rows than the minimum", "a chunked prompt", "short chunks",
                                  "prompts of two slots"])
def test_scratch_is_bit_equal(ops, smollm2_native, case, kind, threads, switch):
    out = on_threads(threads, lambda: run_both(smollm2_native, kind, torch.float16, CASES[case], switch=switch))
    assert_bit_equal(out)


def test_two_threads_with_scratch_as_one_without(ops, smollm2_native):
    """A 43-token prompt and a 5-row step on two threads with the scratch: bit-equal to one thread with the
    shared buffers."""
    from engine.kv_cache import KVCache
    from engine.native_step import build_decoder

    steps = [prompt(43, 1, 0, [42]), prompt(5, 1, 43, [4], seed=1)]

    def run(on: bool):
        cache = KVCache(smollm2_native.args, 4, 128, torch.float16)
        cache.tensors.k.zero_(), cache.tensors.v.zero_()
        decoder = build_decoder(smollm2_native, cache.tensors)
        decoder.set_stall_fallback(False)
        for switch in SWITCHES:
            getattr(decoder, f"set_{switch}")(on)
        logits = [decoder.step(*args) for args in steps]
        return logits, cache.tensors.k.clone(), cache.tensors.v.clone()

    set_activations(smollm2_native, "int16")
    try:
        assert_bit_equal([on_threads(2, lambda: run(True)), on_threads(1, lambda: run(False))])
    finally:
        set_activations(smollm2_native, "fp32")


def tiles_run(ops) -> bool:
    """Whether this build runs the R16 tiles (AMX): then a prompt's inputs are 12-bit blocks (acti, attni)."""
    return "amx_int8" in open("/proc/cpuinfo").read() and ops.r16_tile_calls() >= 0


@pytest.mark.parametrize("kind", ACTIVATIONS)
def test_scratch_used_by_int16_prompts_only(ops, smollm2_native, kind):
    """The workers' scratch is allocated (and kept) by int16 activations' prompt chunks only, where the R16
    tiles run (else a prompt's inputs have no int16 blocks); decoding batches (a 5-row step) and the switches
    off, never. On one thread: on two, a helper that took no task of the 43-row prompt (paused under the test
    workers' load) allocates its own scratch in the next prompt, which is not the growth checked here."""
    from engine.kv_cache import KVCache
    from engine.native_step import build_decoder

    def run():
        for on in (True, False):
            cache = KVCache(smollm2_native.args, 2, 128, torch.float16)
            decoder = build_decoder(smollm2_native, cache.tensors)
            for switch in SWITCHES:
                getattr(decoder, f"set_{switch}")(on)
            decoder.step(*prompt(5, 0, 0, [4]))
            assert decoder.act_scratch_floats() == 0
            decoder.step(*prompt(43, 1, 0, [42]))
            used = decoder.act_scratch_floats()
            assert (used > 0) == (on and kind == "int16" and tiles_run(ops))
            decoder.step(*prompt(21, 1, 43, [20], seed=2))
            assert decoder.act_scratch_floats() == used  # kept: a shorter prompt does not grow it

    set_activations(smollm2_native, kind)
    try:
        on_threads(1, run)
    finally:
        set_activations(smollm2_native, "fp32")
