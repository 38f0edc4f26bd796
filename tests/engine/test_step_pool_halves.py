"""The step pool's halves (engine/step_pool.h's kHalves, StepPool::set_halves): on two threads a phase that asks for
them (PhasedWork::halves: a prompt chunk's matrix phases) is split in two, the front end walks the lower half up
from 0 and the back end the upper half up from the middle, and the one done first takes the other's rest from its
top; other phases, one thread and halves off keep one range taken from both ends (the back end walking down).
Checked on a harness that records the pool's tasks (tests/engine/step_pool_halves_check.cpp; each task spins a
little, so both threads take part): every phase's units taken exactly once, in that order per thread. The
one-call step's logits and cache stay bit-equal with halves on and off (each output is one task's, whichever
thread takes it)."""
from __future__ import annotations

import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from tests.engine.test_last_rows import assert_bit_equal, prompt, run_both
from tests.engine.test_native_weights import ops, smollm2_native  # noqa: F401 (fixtures)
from tests.engine.test_widened_keys_buffer import on_threads

SIZES, HALVES = [96, 7, 1, 42, 37], {0, 3, 4}  # the harness's phases and those asking for halves


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no g++ to build the step pool's harness")
    here = Path(__file__).parent
    exe = tmp_path_factory.mktemp("pool") / "step_pool_halves_check"
    subprocess.run([compiler, "-std=c++20", "-O2", "-pthread", f"-I{here.parent.parent / 'engine'}",
                    str(here / "step_pool_halves_check.cpp"), "-o", str(exe)], check=True)
    return exe


def recorded(exe, threads: int, halves: bool, steps: int = 200) -> dict:
    """{(step, phase): {worker: [(u0, u1, descending), ...] in the order it ran them}}. 200 steps (~0.1 s): enough
    for the helper to take part in some even when the test workers' load pauses it for a while."""
    out = subprocess.run([str(exe), str(threads), str(int(halves)), str(steps)], check=True, capture_output=True,
                         text=True, timeout=60).stdout
    tasks: dict = defaultdict(lambda: defaultdict(list))
    for line in out.splitlines():
        step, phase, worker, u0, u1, descending = map(int, line.split())
        tasks[(step, phase)][worker].append((u0, u1, bool(descending)))
    return tasks


def assert_each_unit_once(tasks: dict, steps: int) -> None:
    for step in range(steps):
        for phase, size in enumerate(SIZES):
            units = sorted(u for per in tasks[(step, phase)].values() for t in per for u in range(t[0], t[1]))
            assert units == list(range(size)), (step, phase)


def walks(per: list, start: int, descending: bool) -> bool:
    """Whether the tasks of one direction follow each other without gaps, the first at ``start`` (up: its u0;
    down: its u1), or there are none."""
    run = [t for t in per if t[2] == descending]
    at = start
    for u0, u1, _ in run:
        if (u1 if descending else u0) != at:
            return False
        at = u0 if descending else u1
    return True


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("halves", [True, False])
def test_every_unit_is_taken_once(harness, threads, halves):
    assert_each_unit_once(recorded(harness, threads, halves), 200)


def test_one_thread_walks_every_phase_up(harness):
    tasks = recorded(harness, 1, True)
    for (step, phase), per in tasks.items():
        assert set(per) == {0}
        assert walks(per[0], 0, False) and not any(t[2] for t in per[0]), (step, phase)


def test_two_threads_walk_the_halves_up(harness):
    tasks = recorded(harness, 2, True)
    helper_walked_up = 0
    for (step, phase), per in tasks.items():
        size = SIZES[phase]
        front, back = per.get(0, []), per.get(1, [])
        if phase in HALVES:
            # the front end from 0 and the back end from the middle, upwards; a thread done with its half takes
            # the other's rest downwards from its top (the front end from the phase's end, the back end from the
            # middle)
            assert walks(front, 0, False) and walks(back, size // 2, False), (step, phase, per)
            assert all(u1 <= size // 2 for u0, u1, d in front if not d), (step, phase)
            assert all(u0 >= size // 2 for u0, u1, d in back if not d), (step, phase)
            assert walks(front, size, True) and walks(back, size // 2, True), (step, phase, per)
            helper_walked_up += sum(1 for t in back if not t[2])
        else:  # one range from both ends: the front end up from 0, the back end down from the end
            assert walks(front, 0, False) and not any(t[2] for t in front), (step, phase)
            assert walks(back, size, True) and all(t[2] for t in back), (step, phase)
    assert helper_walked_up > 0  # the helper took part: the checks above saw its tasks


def test_without_halves_the_back_end_walks_down(harness):
    tasks = recorded(harness, 2, False)
    helper_tasks = 0
    for (step, phase), per in tasks.items():
        size = SIZES[phase]
        assert walks(per.get(0, []), 0, False) and not any(t[2] for t in per.get(0, [])), (step, phase)
        assert walks(per.get(1, []), size, True) and all(t[2] for t in per.get(1, [])), (step, phase)
        helper_tasks += len(per.get(1, []))
    assert helper_tasks > 0


@pytest.mark.parametrize("kind", ["fp32", "int16"])
@pytest.mark.parametrize("rows", [43, 12])
def test_a_prompt_is_bit_equal_with_and_without_halves(ops, smollm2_native, kind, rows):
    """Two threads, a prompt chunk of 43 (12-bit tiles) or 12 rows, then a decoding step: the logits and the cache
    bit-equal whichever way the pool hands out the matrix phases' units."""
    steps = [prompt(rows, 0, 0, [rows - 1], seed=3), prompt(1, 0, rows, [0], seed=4)]
    out = on_threads(2, lambda: run_both(smollm2_native, kind, torch.float16, steps, switch="halves", slots=2,
                                         positions=64))
    assert_bit_equal(out)


def test_halves_are_on_by_default(ops, smollm2_native):
    from engine.kv_cache import KVCache
    from engine.native_step import build_decoder

    decoder = build_decoder(smollm2_native, KVCache(smollm2_native.args, 2, 64, torch.float16).tensors)
    assert decoder.halves()
    decoder.set_halves(False)
    assert not decoder.halves()
