"""``python -m bench.step_options_ab``: the one-call step's prompt options (last rows only, fp16 keys
widened once) alternating in one engine."""
from __future__ import annotations

import re

import pytest

from bench import step_options_ab
from engine import kernels


def test_one_sample_prints_every_arm(capsys, smollm2_dir):
    if kernels.load_kernels() is None:
        pytest.skip(f"no kernels here: {kernels.unavailable_reason()} (the one-call step needs them)")
    step_options_ab.main(["--int16-activations", "--tokens", "20", "--samples", "1", "--threads", "1"])
    out = capsys.readouterr().out
    header = re.search(r"^20-token prompt\s+before\s+last rows\s+both$", out, re.M)
    cpu = re.search(r"^  process CPU\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)
    assert header and cpu and all(float(v) > 0 for v in cpu.groups()), out
    assert "load before" in out and "load after" in out
