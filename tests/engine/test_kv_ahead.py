"""A decoding row's attention task asks for the keys and values of the task its thread likely takes next while it
computes (engine/decode_ops.h's NextKV, NativeDecoder::set_kv_ahead; on by default). Prefetches only: the logits
and the cache bit-equal with the switch on and off, for decoding batches of 8 and 3 rows at scattered positions
(each row's next task another slot with more or fewer keys), on one thread and on two, fp16 and fp32 caches."""
from __future__ import annotations

import pytest
import torch

from tests.engine.test_last_rows import assert_bit_equal, prompt, prompt_ids, run_both
from tests.engine.test_native_weights import ops, smollm2_native  # noqa: F401 (fixtures)
from tests.engine.test_widened_keys_buffer import on_threads

LENGTHS = [20, 7, 33, 16, 41, 1, 25, 12]  # slot s's prompt: 16 (a whole block of keys) and 1 (one key) among them


def decoding_steps(rows: int) -> list:
    """Prompts for `rows` slots, then three decoding steps of all of them (one token each, every row at its own
    position), then one of every other slot."""
    steps = [prompt(n, s, 0, [n - 1], seed=s) for s, n in enumerate(LENGTHS[:rows])]
    for i in range(3):
        slots = torch.arange(rows)
        positions = torch.tensor(LENGTHS[:rows]) + i
        steps.append((prompt_ids(rows, 10 + i), positions, slots, torch.arange(rows)))
    odd = torch.arange(1, rows, 2)
    steps.append((prompt_ids(len(odd), 20), torch.tensor(LENGTHS[:rows])[odd] + 3, odd, torch.arange(len(odd))))
    return steps


@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", ["fp32", "int16"])
@pytest.mark.parametrize("rows", [8, 3])
def test_kv_ahead_is_bit_equal(ops, smollm2_native, rows, kind, threads, kv_dtype):
    out = on_threads(threads, lambda: run_both(smollm2_native, kind, kv_dtype, decoding_steps(rows), switch="kv_ahead",
                                               slots=8, positions=64))
    assert_bit_equal(out)


def test_kv_ahead_is_on_by_default(ops, smollm2_native):
    from engine.kv_cache import KVCache
    from engine.native_step import build_decoder

    cache = KVCache(smollm2_native.args, 2, 64, torch.float16)
    decoder = build_decoder(smollm2_native, cache.tensors)
    assert decoder.kv_ahead()
    decoder.set_kv_ahead(False)
    assert not decoder.kv_ahead()
