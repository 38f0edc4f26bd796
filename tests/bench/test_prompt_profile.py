"""``python -m bench.prompt_profile``: a prompt's wall time and CPU per phase, one round in this tree."""
from __future__ import annotations

import re

from bench import prompt_profile


def test_one_round_prints_each_phase_of_each_size(capsys, smollm2_dir):
    prompt_profile.main(["--tokens", "12,40", "--samples", "1", "--rounds", "1", "--threads", "1"])
    out = capsys.readouterr().out
    assert "load before" in out and re.search(r"^round 1 this tree: 12 tok [\d.]+ ms, 40 tok [\d.]+ ms", out, re.M), out
    for size in ("12", "40"):
        table = out[out.index(f"{size}-token prompt"):]
        for phase in ("wall", "qkv", "attention", "gate/up \\+ SiLU", "LM head", "waits"):
            match = re.search(rf"^  {phase}\s+\| +(-?[\d.]+)", table, re.M)
            assert match, (phase, table)
        assert float(re.search(r"^  wall\s+\| +([\d.]+)", table, re.M)[1]) > 0
        assert float(re.search(r"^  gate/up \+ SiLU\s+\| +([\d.]+)", table, re.M)[1]) > 0  # the profile was on
