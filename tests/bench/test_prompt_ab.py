"""``python -m bench.prompt_ab``: the prompt path with AMX tiles on and off in one engine, one round."""
from __future__ import annotations

import re

import pytest

from bench import prompt_ab
from engine import kernels


@pytest.mark.parametrize("flags", [["--quant", "int8"], ["--quant", "native", "--int16-activations"]])
def test_one_round_prints_both_arms(capsys, smollm2_dir, flags):
    ops = kernels.load_kernels()
    if ops is None or not ops.set_prefill_amx(True):
        pytest.skip("no AMX here (or no kernels): prompt_ab has nothing to compare and says so")
    prompt_ab.main([*flags, "--rounds", "1", "--ttft-samples", "1", "--threads", "1"])
    out = capsys.readouterr().out
    for arm in ("amx", "fma"):
        match = re.search(rf"^{arm}: TTFT median ([\d.]+) ms .*prefill median (\d+) tok/s", out, re.M)
        assert match and float(match[1]) > 0 and int(match[2]) > 0, out
    assert "load before" in out and "load after" in out
