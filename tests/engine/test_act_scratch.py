"""A gate/up task's gate and up outputs and silu(gate) * up in its worker's own scratch (engine/decode_step.cpp's
StepWork::act_local, NativeDecoder::set_act_scratch) where down reads only act's int16 blocks (int16
activations), instead of the step's shared gate_up and act buffers: the logits and the cache bit-equal to the
shared buffers' (set_act_scratch(False), as before), on one thread and on two; the other activations keep the
shared buffers (down reads act there)."""
from __future__ import annotations

import pytest
import torch

from tests.engine.test_last_rows import ACTIVATIONS, CASES, assert_bit_equal, prompt, run_both, set_activations
from tests.engine.test_native_weights import ops, smollm2_native  # noqa: F401 (fixtures)
from tests.engine.test_widened_keys_buffer import on_threads


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", ACTIVATIONS)
@pytest.mark.parametrize("case", ["one row", "more rows than the minimum", "a chunked prompt", "short chunks",
                                  "prompts of two slots"])
def test_act_scratch_is_bit_equal(ops, smollm2_native, case, kind, threads):
    out = on_threads(threads, lambda: run_both(smollm2_native, kind, torch.float16, CASES[case], switch="act_scratch"))
    assert_bit_equal(out)


def test_two_threads_with_act_scratch_as_one_without(ops, smollm2_native):
    """A 43-token prompt and a 5-row step on two threads with the scratch: bit-equal to one thread with the
    shared buffers."""
    steps = [prompt(43, 1, 0, [42]), prompt(5, 1, 43, [4], seed=1)]
    a = on_threads(2, lambda: run_both(smollm2_native, "int16", torch.float16, steps, switch="act_scratch"))[0]
    b = on_threads(1, lambda: run_both(smollm2_native, "int16", torch.float16, steps, switch="act_scratch"))[1]
    assert_bit_equal([a, b])


@pytest.mark.parametrize("kind", ACTIVATIONS)
def test_act_scratch_used_by_int16_only(ops, smollm2_native, kind):
    """The workers' scratch is allocated (and kept) by int16 activations' steps only: a 5-row step always
    quantizes act to int16 blocks, a 43-token prompt where the R16 tiles run; with the switch off, never."""
    from engine.kv_cache import KVCache
    from engine.native_step import build_decoder

    set_activations(smollm2_native, kind)
    try:
        for on in (True, False):
            cache = KVCache(smollm2_native.args, 2, 128, torch.float16)
            decoder = build_decoder(smollm2_native, cache.tensors)
            decoder.set_act_scratch(on)
            assert decoder.act_scratch_floats() == 0
            decoder.step(*prompt(5, 0, 0, [4]))
            used = decoder.act_scratch_floats()
            assert (used > 0) == (on and kind == "int16")
            decoder.step(*prompt(43, 1, 0, [42]))
            decoder.step(*prompt(6, 0, 5, [5], seed=2))
            assert decoder.act_scratch_floats() >= used  # grown or kept, never given back
    finally:
        set_activations(smollm2_native, "fp32")
