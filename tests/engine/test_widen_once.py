"""A prompt's attention over an fp16 KV cache (engine/decode_step.cpp's StepWork::runs): the keys and values
0..the last position of each run of a slot's consecutive rows are widened to fp32 once per layer and kv head
(by the qkv task that wrote the head), and every attention task of 16 rows reads them, where each task
widened its own keys 0..its last position before (O(T^2) over a prompt). The logits and the cache must be
bit-equal to the tasks' own widening (set_widen_once(False), as before)."""
from __future__ import annotations

import pytest
import torch

from tests.engine.test_last_rows import assert_bit_equal, prompt, prompt_ids, run_both
from tests.engine.test_native_weights import ops, smollm2_native  # noqa: F401 (fixtures)


CASES = {
    "every row's logits": [prompt(43, 1, 0, list(range(43)))],
    "the last row's logits": [prompt(43, 1, 0, [42])],
    "a long prompt": [prompt(250, 1, 0, [249, 3, 100])],
    "a chunked prompt": [prompt(35, 2, 0, [], seed=1), prompt(21, 2, 35, list(range(21)), seed=2)],
    "a short run after a chunk": [prompt(40, 2, 0, [], seed=1), prompt(11, 2, 40, list(range(11)), seed=2)],
    "prompts of two slots": [prompt(20, 0, 0, [], 3), prompt(30, 3, 0, [29], 4),
                             (torch.cat([prompt_ids(12, 5), prompt_ids(19, 6), prompt_ids(3, 7)]),
                              torch.cat([torch.arange(20, 32), torch.arange(30, 49), torch.arange(3)]),
                              torch.tensor([0] * 12 + [3] * 19 + [1] * 3), torch.arange(34))],
    "a prompt mixed with decoding rows": [prompt(9, 0, 0, [8], 1), prompt(12, 2, 0, [11], 2),
                                          (torch.cat([prompt_ids(21, 4), torch.tensor([11, 12])]),
                                           torch.cat([torch.arange(21), torch.tensor([9, 12])]),
                                           torch.tensor([1] * 21 + [0, 2]), torch.arange(23))],
}


@pytest.mark.parametrize("kind", ["fp32", "int16"])
@pytest.mark.parametrize("case", list(CASES))
def test_keys_widened_once_are_bit_equal(ops, smollm2_native, kind, case):
    assert_bit_equal(run_both(smollm2_native, kind, torch.float16, CASES[case], "widen_once", positions=320))


def test_keys_are_widened_once_per_layer_and_kv_head(ops, smollm2_native):
    """A 43-token prompt (every row's logits: every row block attends) widens its slot's 43 keys per layer
    and kv head (its 3 tasks of 16, 16 and 11 rows widened 16, 32 and 43 before); the next chunk of 21 rows
    at position 43 widens 64 (before: 59 for rows 0-15, 64 for rows 16-20 together)."""
    from engine.kv_cache import KVCache
    from engine.native_step import build_decoder

    a = smollm2_native.args
    per_step = a.num_layers * a.num_kv_heads
    widened = {}
    for once in (True, False):
        cache = KVCache(a, 2, 128, torch.float16)
        decoder = build_decoder(smollm2_native, cache.tensors)
        decoder.set_widen_once(once)
        decoder.step(*prompt(43, 1, 0, list(range(43))))
        first = decoder.widened_keys()
        decoder.step(*prompt(21, 1, 43, list(range(21)), seed=1))
        widened[once] = (first, decoder.widened_keys() - first)
    assert widened[True] == (per_step * 43, per_step * 64)
    assert widened[False] == (per_step * (16 + 32 + 43), per_step * (59 + 64))
