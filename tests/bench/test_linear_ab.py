"""``python -m bench.linear_ab``: one linear with int8 activations, AMX tiles against the vector path."""
from __future__ import annotations

import re

import pytest

from bench import linear_ab
from engine import kernels


def test_one_round_prints_both_paths(capsys, smollm2_dir):
    ops = kernels.load_kernels()
    if ops is None or not ops.set_prefill_amx(True):
        pytest.skip("no AMX here (or no kernels): linear_ab has nothing to compare and says so")
    linear_ab.main(["--rows", "16", "--rounds", "1", "--models", "smollm2-135m-instruct"])
    out = capsys.readouterr().out
    lines = re.findall(r"^smollm2-135m-instruct (\S+) Q4_1 \d+x\d+, 16 rows: tiles ([\d.]+) ms .* vector ([\d.]+) ms",
                       out, re.M)
    assert [line[0] for line in lines] == ["gate/up", "down"], out
    assert all(float(t) > 0 and float(v) > 0 for _, t, v in lines)
    assert "load before" in out and "load after" in out


def test_int16_round_prints_every_arm(capsys, smollm2_dir):
    """--int16: SmolLM2's R16 matrices, the tiles on 12-bit rows against the tiles on int16 rows, the VNNI
    kernel, fp32 and bf16 activations."""
    ops = kernels.load_kernels()
    if ops is None or not ops.set_prefill_amx(True):
        pytest.skip("no AMX here (or no kernels): linear_ab has nothing to compare and says so")
    linear_ab.main(["--int16", "--rows", "16", "--rounds", "1"])
    out = capsys.readouterr().out
    lines = re.findall(r"^smollm2 (\S+) Q4_1 \d+x\d+, 16 rows: tiles ([\d.]+) ms .* tiles16 ([\d.]+) ms .* vnni ([\d.]+) ms "
                       r".* fp32 ([\d.]+) ms .* bf16 ([\d.]+) ms .*; tiles vs tiles16 .* vs vnni", out, re.M)
    assert [line[0] for line in lines] == ["gate/up", "down", "q"], out
    assert all(float(v) > 0 for line in lines for v in line[1:])
    assert "load before" in out and "load after" in out
