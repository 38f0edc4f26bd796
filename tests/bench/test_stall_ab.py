"""``python -m bench.stall_ab``: engines of two arms alternating under made-up loads."""
from __future__ import annotations

import json
import os

from bench import stall_ab


def test_each_arm_samples_each_load_and_kind_and_the_loads_end(capsys, smollm2_dir):
    children = set(os.listdir("/proc"))
    stall_ab.main(["--rounds", "2", "--loads", "quiet,bursts", "--kinds", "one,batch", "--tokens", "4", "--off-arm",
                   "--json"])
    report = json.loads(capsys.readouterr().out)
    rows = {(r["load"], r["kind"], r["arm"]): r for r in report["rows"]}
    assert set(rows) == {(load, kind, arm) for load in ("quiet", "bursts") for kind in ("one", "batch")
                         for arm in ("this", "this off")}
    for (load, kind, arm), row in rows.items():
        assert len(row["samples"]) == 2 and row["median_tok_s"] > 0, row
        assert row["ratio"] == 1.0 if arm == "this" else row["ratio"] > 0
        if arm == "this off":
            assert row["max_solo"] == 0  # the fallback off: every step on the threads asked for
    assert not [p for p in set(os.listdir("/proc")) - children if "stall_ab" in _cmdline(p)]  # arms and loads ended


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read()
    except OSError:  # not a process, or it ended meanwhile
        return ""


def test_the_neighbour_load_is_one_busy_loop():
    """``neighbour``: one spinning process (a neighbour's one-thread job on one of the two cores), ``sustained`` two."""
    for load, count in (("neighbour", 1), ("sustained", 2)):
        procs = stall_ab.start_load(load, 0)
        try:
            assert len(procs) == count and all(p.args[-1] == "spin" for p in procs)
        finally:
            for p in procs:
                p.kill()
                p.wait()
