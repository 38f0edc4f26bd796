"""The one-call step's hand-offs (engine/step_pool.h, engine/decode_step.cpp): in a decoding batch the
norms run as the tails of the matrix phases before them, so a layer is 5 phases (qkv, attention, o_proj,
gate/up, down), counted by the step pool's profile; on two threads the tasks are taken from both ends of
each phase and the step still equals the one-thread step bit for bit (with int16 activations:
tests/engine/test_int16_activations.py's test_two_threads_give_the_same_step)."""
from __future__ import annotations

import time

import pytest
import torch

from tests.engine.test_native_weights import ops, smollm2_native  # noqa: F401 (fixtures)


def _tasks_per_step(decoder, steps) -> tuple[list[int], torch.Tensor]:
    """Runs ``steps`` (step() arguments) with profiling -> (tasks per worker, the last step's logits)."""
    decoder.set_profiling(True)
    for args in steps:
        logits = decoder.step(*args)
    profile = decoder.handoff_profile()
    decoder.set_profiling(False)
    pool_steps, per_worker = profile[1], profile[4:]
    assert pool_steps == len(steps)
    return [per_worker[7 * w + 3] for w in range(len(per_worker) // 7)], logits


@pytest.mark.parametrize("int16", [False, True])
def test_a_decode_step_has_five_phases_per_layer(ops, smollm2_native, int16):
    """On one thread every unit of a decoding batch is a task: a batch-1 step runs layer 0's input norm,
    then per layer the units of qkv (64-row units: head_dim), attention (one per kv head), o_proj and
    down (16 rows) and gate/up (32), then the LM head's (128 rows): no task for the other norms, which
    ride in o_proj's and down's tails (7 hand-offs per layer before). A prompt chunk (12 rows) keeps its
    norm phases and the final norm, its qkv tasks write the k/v (a task per row and kv head before), and
    its tasks are up to 64 weight rows (16 norm rows, 512 of the LM head) where every unit was a task."""
    from engine.kv_cache import KVCache
    from engine.native_step import build_decoder

    model = smollm2_native
    a = model.args
    model.int16_activations = int16
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        cache = KVCache(a, 2, 64, torch.float32)
        decoder = build_decoder(model, cache.tensors)
        prompt = (torch.arange(100, 112), torch.arange(12), torch.zeros(12, dtype=torch.long), torch.tensor([11]))
        decode = (torch.tensor([7]), torch.tensor([12]), torch.tensor([0]), torch.tensor([0]))
        prompt_tasks = _tasks_per_step(decoder, [prompt])[0][0]
        decode_tasks = _tasks_per_step(decoder, [decode])[0][0]
    finally:
        torch.set_num_threads(threads)
        model.int16_activations = False
    d, D, I, V, kv = a.head_dim, a.dim, a.intermediate_size, a.vocab_size, a.num_kv_heads
    qkv = (a.num_heads + 2 * kv) * d
    per_layer = qkv // 64 + kv + D // 16 + I // 32 + D // 16
    head = -(-V // 128)
    assert decode_tasks == 1 + a.num_layers * per_layer + head
    # the prompt chunk, per phase (units, most units per task): its norms 4 rows a unit, up to 16 a task;
    # qkv: q's rows 16 at a time and k's and v's a head each (the qkv tasks write the k/v of their heads:
    # no task per (row, kv head) writes them), up to 4 units (64 rows of q) a task; attention per (16
    # rows, kv head) (attend_rows); o_proj and down 16 rows a unit, gate/up 32, up to 64 rows a task;
    # the LM head's 128 rows a unit, 4 a task
    norm = (-(-12 // 4), 16)
    layer = [norm, (a.num_heads * d // 16 + 2 * kv, 4), (-(-12 // 16) * kv, 1), (D // 16, 4), norm, (I // 32, 2),
             (D // 16, 4)]
    phases = layer * a.num_layers + [(1, 1), (head, 4)]
    assert prompt_tasks == sum(pool_tasks(units, most) for units, most in phases)


def pool_tasks(units: int, most: int, threads: int = 1) -> int:
    """The tasks of a phase of ``units`` units on one thread: the step pool's task is a 2 x threads-th of
    the units left, at least 1 and at most ``most``."""
    tasks = 0
    while units > 0:
        units -= min(max(units // (2 * threads), 1), most)
        tasks += 1
    return tasks


def on_one_and_two_threads(model, int16: bool, slots: int, run) -> dict:
    """run(decoder, cache) on a fresh decoder of ``model`` asked for 1, then 2 threads (the stall fallback
    off: really two, even on a busy machine) -> {threads: its result}."""
    from engine.kv_cache import KVCache
    from engine.native_step import build_decoder

    model.int16_activations = int16
    threads = torch.get_num_threads()
    out = {}
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            cache = KVCache(model.args, slots, 64, torch.float32)
            decoder = build_decoder(model, cache.tensors)
            decoder.set_stall_fallback(False)
            out[n] = run(decoder, cache)
    finally:
        torch.set_num_threads(threads)
        model.int16_activations = False
    return out


@pytest.mark.parametrize("int16", [False, True])
def test_a_prompt_on_two_threads_equals_one_thread(ops, smollm2_native, int16):
    """A 43-token prompt (row blocks of 16, 16 and 11; the issue's TTFT prompt) on two threads gives the
    one-thread step's logits of every row and k/v bit for bit, however its phases are split into tasks:
    each output (a 16-row group of weights times every row, a norm's row, a kv head's k/v written by the
    qkv task that computed the head) is computed by one task the same way wherever it runs."""
    T = 43

    def prompt(decoder, cache):
        logits = decoder.step(torch.arange(300, 300 + T) * 7 % 5000, torch.arange(T), torch.ones(T, dtype=torch.long),
                              torch.arange(T))
        return logits, cache.tensors.k[:, 1, :, :T].clone(), cache.tensors.v[:, 1, :, :T].clone()

    out = on_one_and_two_threads(smollm2_native, int16, 2, prompt)
    for a, b in zip(out[1], out[2]):
        assert torch.equal(a, b)


def test_an_expected_step_finds_the_helper_awake(ops, smollm2_native):
    """Between two steps a helper spins ~50 us, then sleeps; the engine's Python between decode steps is
    longer, so the helper slept before every step and the step woke it (joined late, its first phases on
    one thread). ``expect_step(us)`` keeps it awake for the next step (spinning, or woken now if it
    already slept) until the step starts or the time passes; ``expect_step(0)`` lets it sleep again.
    Counted by the step pool's profile: the steps a helper was asleep for when they started."""
    from engine.kv_cache import KVCache
    from engine.native_step import build_decoder

    model = smollm2_native
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        cache = KVCache(model.args, 1, 64, torch.float32)
        decoder = build_decoder(model, cache.tensors)
        decoder.set_stall_fallback(False)  # really two threads, even on a busy machine
        position = [0]

        def asleep_at(gaps) -> int:
            """Steps (one per gap, run after it) whose helper slept through their start."""
            decoder.set_profiling(True)
            for gap in gaps:
                gap()
                decoder.step(torch.tensor([7]), torch.tensor([position[0]]), torch.tensor([0]), torch.tensor([0]))
                position[0] += 1
            sleeps = decoder.handoff_profile()[4 + 7 + 6]  # worker 1's steps begun asleep
            decoder.set_profiling(False)
            return sleeps

        def pause():
            time.sleep(0.005)  # 100x the helper's own spin

        def expected_then_pause():
            decoder.expect_step(500_000)  # the helper is still spinning after the step before
            pause()

        def pause_expected_pause():
            pause()  # asleep by now: expect_step wakes it
            decoder.expect_step(500_000)
            pause()

        asleep_at([pause])  # the helper thread exists
        assert asleep_at([pause] * 6) >= 1  # (6 on a quiet machine)
        assert asleep_at([expected_then_pause] * 6) == 0
        assert asleep_at([pause_expected_pause] * 6) == 0
        decoder.expect_step(0)
        assert asleep_at([pause] * 6) >= 1
    finally:
        torch.set_num_threads(threads)


def _thread_counts(decoder, steps: int, rows: int = 2) -> str:
    """Runs ``steps`` steps of ``rows`` rows of a tiny decoder asked for two threads -> a character per
    step: '1' when the stall fallback ran it on the calling thread alone, '2' when on two threads."""
    out = []
    for _ in range(steps):
        solo = decoder.solo_steps()
        decoder.step(torch.tensor([1, 2][:rows]), torch.tensor([0, 0][:rows]), torch.tensor([0, 1][:rows]),
                     torch.tensor([0, 1][:rows]))
        out.append("1" if decoder.solo_steps() > solo else "2")
    return "".join(out)


def _prompt_threads(decoder, steps: int, rows: int = 40) -> str:
    """``_thread_counts`` for prompt chunks of ``rows`` tokens (slot 0, positions from 0)."""
    out = []
    for _ in range(steps):
        solo = decoder.solo_steps()
        decoder.step(torch.arange(rows) % 40, torch.arange(rows), torch.zeros(rows, dtype=torch.long),
                     torch.tensor([rows - 1]))
        out.append("1" if decoder.solo_steps() > solo else "2")
    return "".join(out)


@pytest.fixture
def scripted_decoder(ops):
    """A tiny decoder on two threads whose steps' stall verdicts and times a test gives (``script_steps``:
    here a two-thread step takes half a one-thread step's time), so the stall fallback's policy
    (engine/step_pool.h's StallFallback) is checked whatever the machine's load."""
    from tests.engine.test_kernels import _tiny_decoder

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        decoder = _tiny_decoder(torch.randn(40, 64, generator=torch.Generator().manual_seed(1)), positions=64)
        decoder.set_stall_fallback(True)
        decoder.script_steps([], 2, 1)  # every step clean until a test says otherwise
        yield decoder
    finally:
        torch.set_num_threads(threads)


def test_one_stall_costs_four_steps_on_one_thread(scripted_decoder):
    """A short disturbance (a neighbour busy for a few ms) stalls one two-thread step: the next 4 steps
    run alone, then two threads again; a fixed span of 64 steps cost half of a 128-token reply at one
    thread's speed. After 32 clean steps the next stall costs 4 again."""
    d = scripted_decoder
    d.script_steps([0, 0, 1], 2, 1)
    assert _thread_counts(d, 40) == "222" + "1" * 4 + "2" * 33
    d.script_steps([1], 2, 1)
    assert _thread_counts(d, 10) == "2" + "1" * 4 + "2" * 5
    assert d.solo_steps() == 8


def test_stalls_that_come_back_double_the_span_up_to_128(scripted_decoder):
    """Sustained contention: every two-thread retry stalls, so the spans run 4, 8, 16, 32, 64, then 128
    steps alone per retry, all but one step in 129 alone from then on."""
    d = scripted_decoder
    d.script_steps([1] * 100, 2, 1)
    spans = [4, 8, 16, 32, 64, 128, 128, 128]
    assert _thread_counts(d, sum(spans) + len(spans)) == "".join("2" + "1" * n for n in spans)


def test_a_stall_within_32_clean_steps_still_doubles_the_span(scripted_decoder):
    """Contention with a few clean steps between stalls is still contention: a stall before 32 clean
    two-thread steps in a row doubles the span; 32 in a row set it back to 4."""
    d = scripted_decoder
    d.script_steps([1, 0, 0, 0, 0, 1] + [0] * 31 + [1] + [0] * 32 + [1], 2, 1)
    assert _thread_counts(d, 1 + 4 + 5 + 8 + 31 + 1 + 16 + 32 + 1 + 4 + 2) == (
        "2" + "1" * 4 + "2" * 5 + "1" * 8 + "2" * 31 + "2" + "1" * 16 + "2" * 32 + "2" + "1" * 4 + "22")


def test_without_the_fallback_stalled_steps_keep_two_threads(scripted_decoder):
    """``set_stall_fallback(False)`` (the A/Bs of the fallback itself): always the threads asked for;
    on again, the fallback starts over (a stall costs 4 steps, not the span it had grown to)."""
    d = scripted_decoder
    d.script_steps([1] * 3, 2, 1)
    assert _thread_counts(d, 18) == "2" + "1" * 4 + "2" + "1" * 8 + "2" + "1" * 3
    d.set_stall_fallback(False)
    d.script_steps([1] * 5, 2, 1)
    assert _thread_counts(d, 5) == "2" * 5
    d.set_stall_fallback(True)
    d.script_steps([1], 2, 1)
    assert _thread_counts(d, 6) == "2" + "1" * 4 + "2"


def test_retries_slower_than_one_thread_double_the_span(scripted_decoder):
    """Contention that slows two threads without a long wait on the calling thread: the retry after a
    span is not stalled but takes longer than the span's one-thread steps, so one thread is faster and
    the span doubles as for a stall; a retry as fast as one thread does not count."""
    d = scripted_decoder
    d.script_steps([1], 1000, 1001)
    assert _thread_counts(d, 1 + 4 + 1 + 8 + 1 + 16 + 1) == "2" + "1" * 4 + "2" + "1" * 8 + "2" + "1" * 16 + "2"
    d.set_stall_fallback(True)  # starts over
    d.script_steps([1], 1000, 1000)
    assert _thread_counts(d, 1 + 4 + 3) == "2" + "1" * 4 + "222"


def test_a_retry_of_another_kind_of_step_is_not_compared(scripted_decoder):
    """The retry is compared only with one-thread steps of its own kind (the same phases and units): a
    one-row step after a span of two-row steps says nothing about two threads for either."""
    d = scripted_decoder
    d.script_steps([1], 1000, 2000)
    assert _thread_counts(d, 1 + 4) == "2" + "1" * 4
    assert _thread_counts(d, 3, rows=1) == "222"


def test_a_stalled_prompt_costs_one_prompt_on_one_thread(scripted_decoder):
    """A prompt chunk counts as its rows / 8 steps (a 40-token chunk: 5, about its time in decode steps):
    a stalled prompt's span of 4 is used up by the next prompt alone, where 4 whole prompts ran alone
    before (the TTFT benchmark: 4 samples at one thread's time per disturbance); a span begun by a decode
    step ends with the prompt that comes during it; and 7 clean prompts (35 steps) set the span back to 4
    as 32 clean decode steps do."""
    d = scripted_decoder
    d.script_steps([1], 2, 1)
    assert _prompt_threads(d, 3) == "212"
    d.set_stall_fallback(True)  # starts over
    d.script_steps([1], 2, 1)
    assert _thread_counts(d, 2) == "21"
    assert _prompt_threads(d, 1) == "1"
    assert _thread_counts(d, 2) == "22"
    d.set_stall_fallback(True)
    d.script_steps([1] + [0] * 7 + [1], 2, 1)
    assert _prompt_threads(d, 1 + 1 + 7 + 1 + 2) == "21" + "2" * 7 + "2" + "12"
