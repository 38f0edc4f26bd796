"""A sleeping helper of the one-call step's pool is woken off the waking thread's CPU (engine/step_pool.h's
wake_sleepers; NativeDecoder.set_steer, on by default) and takes the waker's CPUs back once awake. Why: woken by
the thread about to run a prompt, the helper at times joined it 2-4 ms late, presumably queued on that thread's
own CPU (docs/engine.md, seventeenth session). Checked on the real decoder: a step after idling steers the sleeping
helper (NativeDecoder.steers counts it), no thread of the process is left with fewer CPUs than it had, and with
the switch off nothing is steered."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from tests.engine.test_last_rows import prompt
from tests.engine.test_native_weights import ops, smollm2_native  # noqa: F401 (fixtures)
from tests.engine.test_widened_keys_buffer import on_threads


def allowed_cpus() -> dict[int, str]:
    """Each thread of this process -> its Cpus_allowed_list."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                out[int(task.name)] = line.split(":", 1)[1].strip()
    return out


def steps_after_idling(decoder, tries: int = 20) -> int:
    """Prompt steps on two threads, each after the helper had time to fall asleep -> how many were steered."""
    steered = 0
    for i in range(tries):
        decoder.expect_step(0)  # no step follows: the helper sleeps after its ~50 us spin
        time.sleep(0.02)
        before = decoder.steers()
        decoder.step(*prompt(12, 0, 0, [11], seed=i))
        steered += decoder.steers() - before
    return steered


@pytest.mark.skipif(not Path("/proc/self/task").exists() or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux's per-thread affinity and two CPUs to steer a helper off one")
def test_a_sleeping_helper_is_woken_off_the_wakers_cpu(ops, smollm2_native):
    from engine.kv_cache import KVCache
    from engine.native_step import build_decoder

    decoder = build_decoder(smollm2_native, KVCache(smollm2_native.args, 2, 64, torch.float16).tensors)
    assert decoder.steer()
    before = allowed_cpus()

    def run() -> tuple[int, int]:
        decoder.step(*prompt(12, 0, 0, [11]))  # the helper exists
        on = steps_after_idling(decoder)
        decoder.set_steer(False)
        off = steps_after_idling(decoder, 5)
        decoder.set_steer(True)
        return on, off

    on, off = on_threads(2, run)
    assert on > 0 and off == 0
    # every thread has its CPUs back (a steered helper restores them as it wakes; give a late one a moment): the
    # threads that were there keep theirs (another test's helpers may have been created on one CPU), and the new
    # ones (this decoder's helper) have the main thread's
    deadline = time.monotonic() + 2
    while True:
        now = allowed_cpus()
        if all(now.get(tid, mask) == mask for tid, mask in before.items()) and \
                all(mask == before[os.getpid()] for tid, mask in now.items() if tid not in before):
            break
        assert time.monotonic() < deadline, {tid: (before.get(tid), mask) for tid, mask in now.items()
                                             if mask != before.get(tid, before[os.getpid()])}
        time.sleep(0.01)
