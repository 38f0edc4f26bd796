"""The fused C++ decode kernels (engine/kernels.cpp): each op equals its pure-torch twin, bad input
is refused with a message, the fused decode step equals the generic forward on the real model, and
a machine that cannot build them falls back to the pure-torch path."""
from __future__ import annotations

import logging
import os

import pytest
import torch

from engine import kernels as K
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.kv_cache import KVCache
from engine.loader import load_model
from engine.native_weights import load_native_model
from engine.quant import quantize_int8
from engine.runner import ModelRunner
from engine.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def ops():
    ops = K.load_kernels()
    assert ops is not None, f"the kernels must build on the CI machine (g++ and ninja): {K.unavailable_reason()}"
    return ops


@pytest.mark.parametrize("M", [1, 2, 3, 5, 8, 13])
@pytest.mark.parametrize("N, K_", [(960, 576), (37, 100), (8, 16)])
def test_int8_linear_equals_dequantized_matmul(ops, M, N, K_):
    """Odd sizes too: row counts that are not a multiple of the 8/4-row blocks, K with a tail."""
    g = torch.Generator().manual_seed(M * 1000 + N)
    x = torch.randn(M, K_, generator=g)
    w = torch.randint(-127, 128, (N, K_), dtype=torch.int8, generator=g)
    scale, bias = torch.rand(N, generator=g) / 100, torch.randn(N, generator=g)
    for b in (bias, None):
        expected = K.int8_linear_reference(x.double(), w, scale.double(), None if b is None else b.double())
        got = ops.int8_linear(x, w, scale, b)
        assert got.shape == (M, N) and got.dtype == torch.float32
        assert (got.double() - expected).abs().max().item() < 1e-4 * (1 + expected.abs().max().item())


def test_add_rms_norm_and_silu_mul_equal_torch(ops):
    g = torch.Generator().manual_seed(1)
    residual, x, weight = torch.randn(3, 576, generator=g), torch.randn(3, 576, generator=g), torch.randn(576, generator=g)
    ours, theirs = residual.clone(), residual.clone()
    assert torch.allclose(ops.add_rms_norm_(ours, x, weight, 1e-5), K.add_rms_norm_reference(theirs, x, weight, 1e-5),
                          atol=1e-5)
    assert torch.allclose(ours, theirs)  # the residual was updated in place, the same way
    untouched = residual.clone()
    assert torch.allclose(ops.add_rms_norm_(untouched, None, weight, 1e-5),
                          K.add_rms_norm_reference(residual.clone(), None, weight, 1e-5), atol=1e-5)
    assert torch.equal(untouched, residual)
    gate_up = torch.randn(2, 2 * 1536, generator=g) * 4
    assert torch.allclose(ops.silu_mul(gate_up), K.silu_mul_reference(gate_up), atol=1e-5)


@pytest.mark.parametrize("window", [0, 4])
def test_decode_attention_writes_cache_and_attends_each_own_length(ops, window):
    """Three sequences in slots with holes, one at position 0: same output and same cache as torch
    (and with a sliding window of 4 keys, Mistral's)."""
    H, Hkv, d, S, L = 9, 3, 64, 4, 48
    g = torch.Generator().manual_seed(2)
    k_cache, v_cache = torch.randn(S, Hkv, L, d, generator=g), torch.randn(S, Hkv, L, d, generator=g)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    qkv = torch.randn(3, (H + 2 * Hkv) * d, generator=g)
    cos, sin = torch.randn(3, d, generator=g), torch.randn(3, d, generator=g)
    slots, positions = torch.tensor([0, 2, 3]), torch.tensor([5, 0, 47])
    got = ops.decode_attention(qkv, cos, sin, k_cache, v_cache, slots, positions, H, Hkv, window)
    expected = K.decode_attention_reference(qkv, cos, sin, k_ref, v_ref, slots, positions, H, Hkv, window)
    assert torch.allclose(got, expected, atol=1e-5)
    assert torch.allclose(k_cache, k_ref, atol=1e-6) and torch.equal(v_cache, v_ref)


@pytest.mark.parametrize("d", [64, 128])
def test_decode_attention_at_lengths_around_its_blocks_of_16_keys(ops, d):
    """Rows whose key counts end inside a block of 16 (the keys past the last whole block take their own
    path, decode_ops.h's scores_tail), on one, two and several blocks: torch's output and cache."""
    H, Hkv, S, L = 6, 2, 8, 128
    g = torch.Generator().manual_seed(3)
    k_cache, v_cache = torch.randn(S, Hkv, L, d, generator=g), torch.randn(S, Hkv, L, d, generator=g)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    positions = torch.tensor([14, 15, 16, 30, 32, 46, 99, 127])  # 15, 16, 17, 31, 33, 47, 100, 128 keys
    qkv = torch.randn(len(positions), (H + 2 * Hkv) * d, generator=g) * 2
    cos, sin = torch.randn(len(positions), d, generator=g), torch.randn(len(positions), d, generator=g)
    slots = torch.arange(len(positions))
    got = ops.decode_attention(qkv, cos, sin, k_cache, v_cache, slots, positions, H, Hkv, 0)
    expected = K.decode_attention_reference(qkv, cos, sin, k_ref, v_ref, slots, positions, H, Hkv, 0)
    assert torch.allclose(got, expected, atol=1e-5)
    assert torch.allclose(k_cache, k_ref, atol=1e-6) and torch.equal(v_cache, v_ref)


def test_bad_input_is_refused_with_a_message(ops):
    x, w, scale = torch.randn(1, 16), torch.zeros(8, 16, dtype=torch.int8), torch.ones(8)
    with pytest.raises(RuntimeError, match="w: contiguous int8"):
        ops.int8_linear(x, w.float(), scale, None)
    with pytest.raises(RuntimeError, match="x: contiguous float32"):
        ops.int8_linear(x.double(), w, scale, None)
    cache = torch.zeros(2, 1, 4, 8)
    qkv, rope = torch.zeros(1, 3 * 8), torch.zeros(1, 8)
    with pytest.raises(RuntimeError, match="position out of range"):
        ops.decode_attention(qkv, rope, rope, cache, cache.clone(), torch.tensor([0]), torch.tensor([4]), 1, 1, 0)
    with pytest.raises(RuntimeError, match="slot out of range"):
        ops.decode_attention(qkv, rope, rope, cache, cache.clone(), torch.tensor([2]), torch.tensor([0]), 1, 1, 0)


@pytest.mark.parametrize("quant", ["none", "int8", "native"])
def test_one_call_decode_step_equals_generic_forward(ops, smollm2_dir, quant):
    """The real model in each weight mode (fp32; int8; the GGUF's Q4_1 blocks and Q8_0 embedding):
    batches of 1, 3 and 8 sequences of different lengths in scattered slots, decoded by the one
    native call, give the logits of the generic masked forward and the same cache contents."""
    if quant == "native":
        model = load_native_model(smollm2_dir, 128, ops)  # Q4_1 blocks, Q8_0 embedding and head
    else:
        model = load_model(smollm2_dir, torch.float32, 128)
        model.kernels = ops
        if quant == "int8":
            quantize_int8(model)
    # int8 weights: the keys of later layers carry the rounding of every earlier layer's int8 products, and
    # prompts of 9+ rows attend 16 rows at a time (another addition order than the row-by-row decode):
    # measured 1.02e-5 of the range at batch 8 (9.9e-6 with rows attending one by one), 1.4e-6 in fp32
    check_one_call_step(model, key_tolerance=3e-5 if quant == "int8" else 1e-5)


SCATTERED_SLOTS = {1: [4], 3: [0, 4, 7], 8: list(range(1, 9))}  # of 9: holes between, and not from 0


def check_one_call_step(model, batches=(1, 3, 8), key_tolerance=1e-5):
    for B in batches:
        slots = SCATTERED_SLOTS[B]
        lengths = [6 + 5 * b for b in range(B)]
        logits, caches = [], []
        for fused in (True, False):
            cache = KVCache(model.args, 9, 128, torch.float32)
            runner = ModelRunner(model, cache)
            assert runner.fused_decode
            runner.fused_decode = fused
            for slot, n in zip(slots, lengths):
                runner.prefill(slot, [(slot * 37 + i * 11) % 4000 + 100 for i in range(n)], 0, want_logits=False)
            logits.append(runner.decode(slots, [1000 + b for b in range(B)], lengths))
            caches.append([cache.tensors.k[:, s, :, : n + 1].clone() for s, n in zip(slots, lengths)])
        assert (logits[0] - logits[1]).abs().max().item() < 1e-4 * logits[1].abs().max().item(), f"batch {B}"
        assert torch.equal(logits[0].argmax(-1), logits[1].argmax(-1)), f"batch {B}"
        for fused_k, generic_k in zip(*caches):  # each slot's keys 0..position, the new one included
            assert (fused_k - generic_k).abs().max().item() < key_tolerance * (1 + generic_k.abs().max().item()), f"batch {B}"


@pytest.fixture(scope="module")
def native_model(ops, smollm2_dir):
    return load_native_model(smollm2_dir, 128, ops)


@pytest.mark.parametrize("B", [1, 3, 8])
def test_mixed_prefill_and_decode_equals_separate_calls(native_model, B):
    """A prompt arriving while B sequences decode: its chunk and the decode rows in one native call
    give the logits and cache of a prefill call followed by a decode call."""
    slots, lengths = SCATTERED_SLOTS[B], [6 + 5 * b for b in range(B)]
    new_slot = 0 if 0 not in slots else 5
    chunk = (new_slot, [(i * 13) % 3000 + 200 for i in range(21)], 0, True)
    results = []
    for mixed in (True, False):
        cache = KVCache(native_model.args, 9, 128, torch.float32)
        runner = ModelRunner(native_model, cache)
        for slot, n in zip(slots, lengths):
            runner.prefill(slot, [(slot * 37 + i * 11) % 4000 + 100 for i in range(n)], 0, want_logits=False)
        decode = (slots, [1000 + b for b in range(B)], lengths)
        if mixed:
            (prompt_logits,), decode_logits = runner.prefill_and_decode([chunk], *decode)
        else:
            (prompt_logits,) = runner.prefill_many([chunk])
            decode_logits = runner.decode(*decode)
        results.append((prompt_logits, decode_logits, cache.tensors.k[:, new_slot, :, :21].clone(),
                        [cache.tensors.k[:, s, :, : n + 1].clone() for s, n in zip(slots, lengths)]))
    (p1, d1, k1, ks1), (p2, d2, k2, ks2) = results
    assert (p1 - p2).abs().max().item() < 1e-4 * p2.abs().max().item()
    assert (d1 - d2).abs().max().item() < 1e-4 * d2.abs().max().item()
    assert (k1 - k2).abs().max().item() < 1e-4
    assert all((a - b).abs().max().item() < 1e-4 for a, b in zip(ks1, ks2))


def _decode_steps(model, steps: int, slots=SCATTERED_SLOTS[3]):
    """A fresh runner (a new thread pool): a sequence prefilled in each slot (3 by default), then
    ``steps`` decode steps -> (the last step's logits, the runner)."""
    runner = ModelRunner(model, KVCache(model.args, 9, 128, torch.float32))
    for slot in slots:
        runner.prefill(slot, [(slot * 37 + i * 11) % 4000 + 100 for i in range(10)], 0, want_logits=False)
    for i in range(steps):
        logits = runner.decode(slots, [1000 + i] * len(slots), [10 + i] * len(slots))
    return logits, runner


def test_a_busy_cpu_moves_the_step_to_one_thread_and_changes_no_logit(native_model):
    """Both step threads and a busy process share one CPU: the helper thread is paused mid-task for
    time slices, the step pool sees its stalls and runs the next steps on the calling thread alone
    (engine/step_pool.h). Every output is computed by one task, so the logits are bit-identical on
    one thread, on two, and across the switch."""
    import subprocess
    import sys

    torch.set_num_threads(1)
    alone, _ = _decode_steps(native_model, 24)
    torch.set_num_threads(2)
    quiet, runner = _decode_steps(native_model, 24)
    assert torch.equal(alone, quiet)
    cpu = sorted(os.sched_getaffinity(0))[0]
    saved = os.sched_getaffinity(0)
    spin = (f"import os, time; os.sched_setaffinity(0, {{{cpu}}}); print('spinning', flush=True); "
            "end = time.monotonic() + 10\nwhile time.monotonic() < end: pass")
    busy = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout.readline().strip() == "spinning"
        os.sched_setaffinity(0, {cpu})  # this thread, and the pool's helpers created by its first step
        contended, runner = _decode_steps(native_model, 24)
    finally:
        os.sched_setaffinity(0, saved)
        busy.kill()
        busy.wait()
    assert torch.equal(contended, quiet)
    assert runner.decoder.solo_steps() > 0


def test_engine_without_kernels_uses_the_pure_torch_path(smollm2_dir):
    engine = LLMEngine(smollm2_dir, EngineConfig(kernels=False, max_seq_len=256, num_slots=1, max_batch_size=1,
                                                 admission_window_ms=0), background=False)
    try:
        assert engine.model.kernels is None and not engine.runner.fused_decode
        stream = engine.submit([{"role": "user", "content": "What is the capital of France?"}],
                               SamplingParams(temperature=0, max_tokens=12))
        engine.run_until_idle()
        assert "Paris" in stream.text()
    finally:
        engine.close()


def test_a_failed_build_falls_back_with_the_reason(monkeypatch, caplog):
    from torch.utils import cpp_extension

    def no_compiler(**kwargs):
        raise RuntimeError("Error building extension 'voxlane_kernels': g++: not found")

    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    monkeypatch.setattr(K, "_state", {})
    with caplog.at_level(logging.WARNING, logger="engine.kernels"):
        assert K.load_kernels() is None
    assert "g++: not found" in K.unavailable_reason()
    assert "pure-torch path" in caplog.text


def test_a_dead_builds_lock_file_does_not_hang_the_next_load(ops, tmp_path):
    """A build killed midway leaves torch's ``lock`` file in the build directory; the next process
    that loads the kernels clears it (under our own flock) instead of waiting for it forever."""
    import subprocess
    import sys

    stale = K.build_dir() / "lock"
    stale.write_text("")
    try:
        code = "from engine import kernels; assert kernels.load_kernels() is not None, kernels.unavailable_reason()"
        done = subprocess.run([sys.executable, "-c", code], timeout=300, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        assert not stale.exists()
    finally:
        stale.unlink(missing_ok=True)


def test_the_library_path_is_the_loaded_librarys_whatever_the_sources_are_now(ops, monkeypatch):
    """StepCalls dlopens library_path() to call into the loaded kernels' classes: it is the library the
    load built or found, not one named by hashing the sources again (edited sources, another key)."""
    loaded = K.library_path()
    assert loaded is not None and loaded.is_file() and loaded.parent == K.build_dir()
    monkeypatch.setattr(K, "build_key", lambda: "sources-edited-since")
    assert K.library_path() == loaded


def test_two_threads_split_a_decode_steps_attention_and_change_no_logit(native_model):
    """Batch 1 on two threads: the attention of each kv head is split over its query heads (3 tasks
    of SmolLM2's 3 kv heads would leave one thread idle) and the qkv tasks write the new k/v. The step
    equals the generic forward, and one thread's logits bit for bit."""
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        check_one_call_step(native_model, batches=(1,))
        two, _ = _decode_steps(native_model, 6, slots=[4])
        torch.set_num_threads(1)
        one, _ = _decode_steps(native_model, 6, slots=[4])
    finally:
        torch.set_num_threads(saved)
    assert torch.equal(two, one)


def _tiny_decoder(head: torch.Tensor, positions: int = 8):
    """A one-layer fp32 ``NativeDecoder`` (dim 64, one head, ``positions`` per slot) whose LM head is
    ``head`` [V, 64]."""
    from engine import gguf_formats as fmt

    g = torch.Generator().manual_seed(3)
    D, V, L = 64, head.shape[0], positions
    cache = torch.zeros(1, 2, 1, L, D)
    decoder = torch.classes.voxlane.NativeDecoder(D, 1, 1, D, D, 1, 1e-5, 0, torch.ones(L, D), torch.zeros(L, D),
                                                  cache, cache.clone())

    def add(role, rows, weight=None):
        weight = torch.randn(rows, D, generator=g) if weight is None else weight
        decoder.add_linear(-1 if role in ("head", "embed") else 0, role, weight.contiguous().view(torch.uint8), fmt.F32, D,
                           None, None, False)

    for role, rows in (("qkv", 3 * D), ("o", D), ("gate_up", 2 * D), ("down", D), ("embed", V)):
        add(role, rows)
    add("head", V, head)
    for layer, role in ((0, "input"), (0, "post"), (-1, "final")):
        decoder.add_norm(layer, role, torch.ones(D))
    decoder.set_stall_fallback(False)
    return decoder


def test_the_step_finds_numpys_argmax_of_its_logits(ops):
    """``NativeDecoder.argmax()``: the first maximum of each logits row of the last step, found by the LM
    head's tasks (16-row units on two threads) and merged: what the greedy sampler takes instead of
    numpy's argmax over the logits, so it must choose as numpy does: of equal maxima the first, even
    when they are in two tasks, and the first NaN over any number."""
    g = torch.Generator().manual_seed(5)
    u = torch.randn(64, generator=g)
    ties = torch.zeros(40)
    ties[[3, 30]], ties[[10, 20]], ties[[12, 13]] = 5.0, -5.0, 4.0  # max at 3 (u . h > 0) or at 10
    nans = ties.clone()
    nans[[33, 25]] = float("nan")
    heads = {"ties": ties[:, None] * u, "nans": nans[:, None] * u, "zeros": torch.zeros(40, 64),
             "random": torch.randn(1000, 64, generator=g)}
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            for name, head in heads.items():
                decoder = _tiny_decoder(head)
                logits = decoder.step(torch.tensor([1, 2]), torch.tensor([0, 0]), torch.tensor([0, 1]), torch.tensor([0, 1]))
                want = logits.numpy().argmax(-1).tolist()
                assert decoder.argmax() == want, (name, n)
                if name == "nans":
                    assert want == [25, 25]
    finally:
        torch.set_num_threads(threads)


def test_greedy_decoding_takes_the_steps_argmax(native_model, monkeypatch):
    """The runner's greedy tokens of a decode batch are the one-call step's argmax, through its C call
    (``StepCalls``: no logits come back, the sampler does not read them), and they are numpy's argmax
    of the same logits. A bad input raises the step's own message."""
    from engine import sampler
    from engine.scheduler import StepPlan
    from engine.sequence import Sequence

    cache = KVCache(native_model.args, 4, 64, torch.float32)
    runner = ModelRunner(native_model, cache)
    seqs = [Sequence(i, [100 + i, 200, 300], SamplingParams(temperature=0.0)) for i in range(3)]
    for slot, seq in enumerate(seqs):
        seq.slot = slot
        runner.prefill(slot, seq.prompt_ids[:-1], 0, want_logits=False)
        seq.num_cached = len(seq.prompt_ids) - 1
    logits = runner.decode([0, 1, 2], [s.prompt_ids[-1] for s in seqs], [2, 2, 2])
    for slot, seq in enumerate(seqs):
        runner.prefill(slot, seq.prompt_ids[:-1], 0, want_logits=False)  # the same cache again
    monkeypatch.setattr(sampler, "greedy_tokens", lambda _: pytest.fail("the logits were read again"))
    ran = runner.run(StepPlan(decode=seqs))
    assert [token for _, token in ran.tokens] == logits.numpy().argmax(-1).tolist()
    with pytest.raises(RuntimeError, match="token id out of range"):
        runner.step_calls.step([10**9], [3], [0])


def _fresh_runner(native_model, decoding, prompts_by_slot):
    """A runner over a zeroed cache of 7 slots: the decoding sequences in slots 0.. with their prompts but the
    last token prefilled, the prompts given their slots -> (runner, cache)."""
    cache = KVCache(native_model.args, 7, 64, torch.float32)
    cache.tensors.k.zero_(), cache.tensors.v.zero_()
    runner = ModelRunner(native_model, cache)
    for slot, seq in enumerate(decoding):
        seq.slot = slot
        runner.prefill(slot, seq.prompt_ids[:-1], 0, want_logits=False)
        seq.num_cached = len(seq.prompt_ids) - 1
    for slot, seq in prompts_by_slot.items():
        seq.slot = slot
    return runner, cache


def _without_custom_step(runner):
    """The runner's decoder behind a wrapper whose custom-class step fails the test -> the decoder."""
    decoder = runner.decoder

    class NoCustomStep:
        def __getattr__(self, name):
            return getattr(decoder, name)

        def step(self, *inputs):
            pytest.fail("the custom-class step ran")

    runner.decoder = NoCustomStep()
    return decoder


@pytest.mark.parametrize("B", [0, 1, 3])
def test_greedy_prompts_take_the_steps_argmax(native_model, monkeypatch, B):
    """A step of greedy prompt chunks (two prompts, one of them ending here) and B greedy decode rows runs
    as one C call (``StepCalls.rows``): no custom-class call, no logits read by the sampler, and its
    tokens are the argmax of the logits the custom-class step gives for the same rows and cache. A
    sampled (non-greedy) prompt still goes through the sampler."""
    from engine import sampler
    from engine.scheduler import StepPlan
    from engine.sequence import Sequence

    decoding = [Sequence(10 + i, [100 + i, 200, 300], SamplingParams(temperature=0.0)) for i in range(B)]
    prompts = [Sequence(1, [(i * 13) % 3000 + 200 for i in range(21)], SamplingParams(temperature=0.0)),
               Sequence(2, [(i * 7) % 3000 + 100 for i in range(30)], SamplingParams(temperature=0.0))]

    def fresh_runner():
        return _fresh_runner(native_model, decoding, {4: prompts[0], 5: prompts[1]})

    # the first prompt ends in this step; the second is chunked (its first 16 tokens, no token wanted)
    plan = StepPlan(prefills=[(prompts[0], 0, 21), (prompts[1], 0, 16)], decode=decoding)
    runner, want_cache = fresh_runner()
    chunks = [(4, prompts[0].prompt_ids, 0, True), (5, prompts[1].prompt_ids[:16], 0, False)]
    decode = ([s.slot for s in decoding], [s.prompt_ids[-1] for s in decoding], [2] * B)
    prompt_logits, decode_logits = runner.prefill_and_decode(chunks, *decode)
    want = prompt_logits[0][None].numpy().argmax(-1).tolist() + decode_logits.numpy().argmax(-1).tolist()

    runner, cache = fresh_runner()
    monkeypatch.setattr(sampler, "greedy_tokens", lambda _: pytest.fail("the logits were read"))
    decoder = _without_custom_step(runner)
    ran = runner.run(plan)
    assert [(seq.id, token) for seq, token in ran.tokens] == list(zip([1] + [s.id for s in decoding], want))
    for slot in [4, 5] + [s.slot for s in decoding]:
        assert torch.equal(cache.tensors.k[:, slot], want_cache.tensors.k[:, slot]), slot
        assert torch.equal(cache.tensors.v[:, slot], want_cache.tensors.v[:, slot]), slot
    assert cache._initialized[4] == 21 and cache._initialized[5] == 16

    runner.decoder = decoder
    monkeypatch.undo()
    prompts[0].sampling = SamplingParams(temperature=0.8, seed=3)
    calls = []
    monkeypatch.setattr(runner.sampler, "sample", lambda logits, seqs: calls.append(len(seqs)) or [7] * len(seqs))
    runner.run(StepPlan(prefills=[(prompts[0], 0, 21)]))
    assert calls == [1]


@pytest.mark.parametrize("B", [0, 1, 3])
def test_sampled_steps_take_their_logits_through_one_c_call(native_model, monkeypatch, B):
    """A step that samples (a prompt ending here, a chunk of another, B sampled decode rows) or probes a
    prompt's end runs as one C call (``StepCalls.logits``: no custom-class call): the sampler gets the
    logits the custom-class step gives for the same rows and cache, bit for bit, prompt rows first; the
    probe gets probability_of its row; the cache is the same."""
    from engine.sampler import probability_of
    from engine.scheduler import StepPlan
    from engine.sequence import Sequence

    sampled = SamplingParams(temperature=0.8, top_p=0.9, seed=5)
    decoding = [Sequence(10 + i, [100 + i, 200, 300], sampled) for i in range(B)]
    prompts = [Sequence(1, [(i * 13) % 3000 + 200 for i in range(21)], sampled),
               Sequence(2, [(i * 7) % 3000 + 100 for i in range(30)], sampled),
               Sequence(3, [(i * 11) % 3000 + 50 for i in range(9)], sampled, probe_ids=frozenset({5, 6}))]

    def fresh_runner():
        return _fresh_runner(native_model, decoding, {4: prompts[0], 5: prompts[1], 6: prompts[2]})

    plan = StepPlan(prefills=[(prompts[0], 0, 21), (prompts[1], 0, 16), (prompts[2], 0, 9)], decode=decoding)
    runner, want_cache = fresh_runner()
    chunks = [(4, prompts[0].prompt_ids, 0, True), (5, prompts[1].prompt_ids[:16], 0, False),
              (6, prompts[2].prompt_ids, 0, True)]
    decode = ([s.slot for s in decoding], [s.prompt_ids[-1] for s in decoding], [2] * B)
    prompt_logits, decode_logits = runner.prefill_and_decode(chunks, *decode)

    runner, cache = fresh_runner()
    decoder = _without_custom_step(runner)
    seen = []
    monkeypatch.setattr(runner.sampler, "sample",
                        lambda logits, seqs: seen.append((logits.clone(), [s.id for s in seqs])) or [7] * len(seqs))
    ran = runner.run(plan)
    assert seen[0][1] == [1] and torch.equal(seen[0][0][0], prompt_logits[0])
    if B:
        assert seen[1][1] == [s.id for s in decoding] and torch.equal(seen[1][0], decode_logits)
    assert len(seen) == (2 if B else 1)
    assert [(seq.id, token) for seq, token in ran.tokens] == [(1, 7)] + [(s.id, 7) for s in decoding]
    assert ran.probes == [(prompts[2], probability_of(prompt_logits[2], prompts[2].probe_ids))]
    for slot in [4, 5, 6] + [s.slot for s in decoding]:
        assert torch.equal(cache.tensors.k[:, slot], want_cache.tensors.k[:, slot]), slot
        assert torch.equal(cache.tensors.v[:, slot], want_cache.tensors.v[:, slot]), slot
    with pytest.raises(RuntimeError, match="token id out of range"):
        runner.step_calls.logits([10**9], [3], [0], [0])


def test_a_greedy_chunk_that_does_not_end_its_prompt_samples_nothing(native_model):
    """A greedy step of one prompt chunk before the prompt's end (no logit rows: ``StepCalls.rows`` with
    L = 0) writes its k/v and gives no token; the next chunk, which ends the prompt, gives the first."""
    from engine.scheduler import StepPlan
    from engine.sequence import Sequence

    runner = ModelRunner(native_model, KVCache(native_model.args, 2, 64, torch.float32))
    seq = Sequence(1, list(range(200, 230)), SamplingParams(temperature=0.0))
    seq.slot = 0
    assert runner.run(StepPlan(prefills=[(seq, 0, 16)])).tokens == []
    assert runner.kv_cache._initialized[0] == 16
    assert [s.id for s, _ in runner.run(StepPlan(prefills=[(seq, 16, 30)])).tokens] == [1]


def test_decode_steps_write_their_inputs_into_the_same_tensors(native_model):
    """A decode batch's tokens, positions, slots and logit rows go to the one-call step in tensors made once
    per batch size and rewritten in place (four new tensors a step were ~14 us of the engine's Python)."""
    runner = ModelRunner(native_model, KVCache(native_model.args, 4, 64, torch.float32))
    decoder, calls = runner.decoder, []

    class Spy:
        def step(self, *inputs):
            calls.append([(t.data_ptr(), t.tolist()) for t in inputs])
            return decoder.step(*inputs)

    runner.decoder = Spy()
    for i in range(3):
        runner.decode([1, 3], [7 + i, 9 + i], [i, i])
    runner.decode([2], [5], [0])
    assert [[values for _, values in c] for c in calls] == [
        [[7 + i, 9 + i], [i, i], [1, 3], [0, 1]] for i in range(3)] + [[[5], [0], [2], [0]]]
    assert len({tuple(ptr for ptr, _ in c) for c in calls[:3]}) == 1  # the same four tensors each step
