"""bench.decode_ab: settings alternate round by round (each thread count, then each arm), medians are
taken per arm and thread count (wall and CPU ms), samples keep their steps-on-one-thread count, and a revision's arms
run in that revision's exported tree (the decode_profile runs themselves are stand-ins here)."""
from __future__ import annotations

import json

from bench import decode_ab


def test_arms_alternate_and_medians_are_per_arm_and_thread_count(monkeypatch, capsys, tmp_path):
    calls = []
    times = iter([1.0, 2.0] + [10.0, 20.0, 5.0, 6.0, 12.0, 22.0, 7.0, 8.0, 11.0, 21.0, 6.0, 9.0])

    def fake_profile(tree, model, threads, steps, batch, args):
        calls.append((tree, threads, args))
        ms = next(times)
        return ms, (3 if threads == 2 and args.endswith("b") else 0), ms / 2

    monkeypatch.setattr(decode_ab, "profile_ms", fake_profile)
    monkeypatch.setattr(decode_ab, "export_tree", lambda rev, into: tmp_path / rev)
    assert decode_ab.main(["--threads", "1,2", "--rounds", "3", "--arm", "A", "--quant a", "--rev-arm", "B", "abc123",
                           "--quant b", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    # warm-up of each arm, then per round: 1 thread A, B; 2 threads A, B
    assert [(c[1], c[2]) for c in calls] == [(1, "--quant a"), (1, "--quant b")] + [(1, "--quant a"), (1, "--quant b"), (2, "--quant a"),
                                                                          (2, "--quant b")] * 3
    assert {c[0] for c in calls if c[2] == "--quant b"} == {tmp_path / "abc123"}
    assert {c[0] for c in calls if c[2] == "--quant a"} == {decode_ab.HERE}
    assert result["median_ms"] == {"A": {"1": 11.0, "2": 6.0}, "B": {"1": 21.0, "2": 8.0}}
    assert result["median_cpu_ms"] == {"A": {"1": 5.5, "2": 3.0}, "B": {"1": 10.5, "2": 4.0}}  # each sample's CPU ms
    assert [s[2] for s in result["samples"]["B"]["2"]] == [3, 3, 3]  # steps on one thread, kept and shown


def test_a_revision_is_exported_as_its_files(tmp_path):
    tree = decode_ab.export_tree("HEAD", tmp_path / "rev")
    assert (tree / "bench" / "decode_ab.py").is_file() and (tree / "engine" / "decode_step.cpp").is_file()
