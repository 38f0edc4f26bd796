"""The one-call step's last layer for the logits rows only (engine/decode_step.cpp's StepWork::last_rows,
llama.cpp's inp_out_ids): in a prompt chunk the last layer's qkv runs for every row (the cache keeps their
k/v), its attention, o_proj, post norm, gate/up, down and the final norm for the rows whose logits are
wanted (gathered, with copies of the first up to 16 rows: the kernels' prompt paths), and nothing after the
qkv when no logits are wanted (a chunk of a prompt before its last). The logits and the cache must be
bit-equal to the step that runs the last layer for every row (set_last_rows_only(False), as before)."""
from __future__ import annotations

import pytest
import torch

from tests.engine.test_decode_handoffs import _tasks_per_step, pool_tasks
from tests.engine.test_native_weights import ops, smollm2_native  # noqa: F401 (fixtures)

ACTIVATIONS = ["fp32", "int8", "bf16", "int16"]  # int16 last: it packs the model's matrices in place for good


def set_activations(model, kind: str) -> None:
    model.int8_activations = kind == "int8"
    model.bf16_activations = kind == "bf16"
    model.int16_activations = kind == "int16"


def prompt_ids(n: int, seed: int) -> torch.Tensor:
    return (torch.arange(n) * 37 + seed * 101) % 4000 + 50


def run_both(model, kind: str, kv_dtype: torch.dtype, steps, switch: str = "last_rows_only", slots: int = 4,
             positions: int = 128) -> list:
    """steps (lists of step() arguments) on a decoder with a switch on (default: the last layer for the logits
    rows only) and on one with it off (every row), each over its own cache -> [(each step's logits, the
    cache's k, v)] for both."""
    from engine.kv_cache import KVCache
    from engine.native_step import build_decoder

    set_activations(model, kind)
    out = []
    try:
        for on in (True, False):
            cache = KVCache(model.args, slots, positions, kv_dtype)
            cache.tensors.k.zero_(), cache.tensors.v.zero_()  # positions not written compare equal
            decoder = build_decoder(model, cache.tensors)
            getattr(decoder, f"set_{switch}")(on)
            assert getattr(decoder, switch)() == on
            logits = [decoder.step(*args) for args in steps]
            out.append((logits, cache.tensors.k.clone(), cache.tensors.v.clone()))
    finally:
        set_activations(model, "fp32")
    return out


def assert_bit_equal(out) -> None:
    (logits_a, k_a, v_a), (logits_b, k_b, v_b) = out
    for a, b in zip(logits_a, logits_b):
        assert a.shape == b.shape and torch.equal(a, b)
    assert torch.equal(k_a, k_b) and torch.equal(v_a, v_b)


def prompt(T: int, slot: int, start: int, rows: list[int], seed: int = 0):
    return (prompt_ids(T, seed), torch.arange(start, start + T), torch.full((T,), slot, dtype=torch.long),
            torch.tensor(rows, dtype=torch.long))


CASES = {
    "one row": [prompt(43, 1, 0, [42])],  # the TTFT prompt
    "several rows": [prompt(43, 1, 0, [42, 5, 17, 30, 16])],  # unordered, in every row block
    "more rows than the minimum": [prompt(43, 1, 0, list(range(40, 20, -1)))],  # 20 rows gathered
    "no rows": [prompt(43, 1, 0, [])],  # the cache written, no logits
    "a chunked prompt": [prompt(35, 2, 0, [], seed=1), prompt(21, 2, 35, [20], seed=2)],  # rows 32-34: per row
    "short chunks": [prompt(5, 1, 0, []), prompt(6, 1, 5, [5]), prompt(3, 1, 11, [])],  # decoding-sized: no rows, all
    "prompts of two slots": [prompt(20, 0, 0, [], 3), prompt(30, 3, 0, [29], 4),
                             (torch.cat([prompt_ids(12, 5), prompt_ids(19, 6)]),
                              torch.cat([torch.arange(20, 32), torch.arange(30, 49)]),
                              torch.tensor([0] * 12 + [3] * 19), torch.tensor([11, 30]))],
}


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16], ids=["fp32 kv", "fp16 kv"])
@pytest.mark.parametrize("kind", ACTIVATIONS)
@pytest.mark.parametrize("case", list(CASES))
def test_the_last_layer_for_the_logits_rows_only_is_bit_equal(ops, smollm2_native, kind, kv_dtype, case):
    out = run_both(smollm2_native, kind, kv_dtype, CASES[case])
    assert_bit_equal(out)
    if case == "no rows":
        assert out[0][0][0].shape == (0, smollm2_native.args.vocab_size)


@pytest.mark.parametrize("kind", ACTIVATIONS)
def test_a_prompt_mixed_with_decoding_rows_is_bit_equal(ops, smollm2_native, kind):
    """A 21-token prompt chunk and 3 decoding rows of other slots in one step (their rows in the chunk's last
    row block: attended one by one there), their 4 logits rows gathered."""
    steps = [prompt(9, 0, 0, [8], 1), prompt(12, 2, 0, [11], 2), prompt(7, 3, 0, [6], 3)]
    tokens = torch.cat([prompt_ids(21, 4), torch.tensor([11, 12, 13])])
    positions = torch.cat([torch.arange(21), torch.tensor([9, 12, 7])])
    slots = torch.tensor([1] * 21 + [0, 2, 3])
    steps.append((tokens, positions, slots, torch.tensor([20, 21, 22, 23])))
    assert_bit_equal(run_both(smollm2_native, kind, torch.float16, steps))


def test_the_last_layer_runs_for_the_logits_rows_only(ops, smollm2_native):
    """On one thread every task is counted: a 43-token prompt's last layer after its qkv has a task per
    logits row and kv head for attention (3 row blocks of 16 per kv head before) and 16 rows of norms (4
    units of 4 rows; 43 rows before), its final norm one task; with no logits rows nothing after the last
    qkv (no attention, o_proj, post norm, gate/up, down, final norm or LM head)."""
    from engine.kv_cache import KVCache
    from engine.native_step import build_decoder

    model = smollm2_native
    a = model.args
    threads = torch.get_num_threads()
    counts = {}
    try:
        torch.set_num_threads(1)
        for only in (True, False):
            for rows in ([42], []):
                cache = KVCache(a, 2, 64, torch.float32)
                decoder = build_decoder(model, cache.tensors)
                decoder.set_last_rows_only(only)
                counts[only, len(rows)] = _tasks_per_step(decoder, [prompt(43, 1, 0, rows)])[0][0]
    finally:
        torch.set_num_threads(threads)
    d, D, I, V, kv = a.head_dim, a.dim, a.intermediate_size, a.vocab_size, a.num_kv_heads
    T = 43

    def norm(rows):
        return pool_tasks(-(-rows // 4), 16)

    units = 128 // 16  # a prompt's matrix tasks: up to 128 weight rows (kPromptTaskRows), units of 16 (gate/up: 32)
    qkv = pool_tasks(a.num_heads * d // 16 + 2 * kv, units)
    matrices = pool_tasks(D // 16, units) + pool_tasks(I // 32, units // 2) + pool_tasks(D // 16, units)  # o, gate/up, down
    layer = norm(T) + qkv + pool_tasks(-(-T // 16) * kv, 1) + matrices + norm(T)
    head = pool_tasks(-(-V // 128), 4)
    before_last = (a.num_layers - 1) * layer + norm(T) + qkv
    assert counts[False, 1] == before_last + pool_tasks(-(-T // 16) * kv, 1) + matrices + norm(T) + 1 + head
    assert counts[True, 1] == before_last + pool_tasks(kv, 1) + matrices + norm(16) + 1 + head
    assert counts[False, 0] == before_last + pool_tasks(-(-T // 16) * kv, 1) + matrices + norm(T) + 1
    assert counts[True, 0] == before_last


@pytest.fixture(scope="module")
def qwen_native(ops, qwen05_dir):
    """Qwen2.5-0.5B's native model (Q5_0, Q8_0, Q4_K, Q6_K blocks; a bias on q/k/v; 14 heads over 2 kv heads)."""
    from engine.native_weights import load_native_model

    return load_native_model(qwen05_dir, 256, ops)


@pytest.mark.parametrize("kind", ["fp32", "int8", "int16"])
def test_qwen_last_layer_for_the_logits_rows_only_is_bit_equal(ops, qwen_native, kind):
    """Other formats (K-quants' blocks of 256, no R16 layout for most of its matrices), a bias, other heads."""
    steps = CASES["several rows"] + CASES["a chunked prompt"] + [prompt(30, 3, 0, [29, 0], 7)]
    assert_bit_equal(run_both(qwen_native, kind, torch.float16, steps))
