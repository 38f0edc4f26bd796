"""``python -m bench.batch_ab``: the batch-8 row in one engine, its wall split per step, and the batch
tiles alternated with the VNNI kernel."""
from __future__ import annotations

import json
import re

import pytest

from bench import batch_ab
from engine import kernels


def test_json_splits_every_run_and_the_tiles_arm_runs_tiles(capsys, smollm2_dir):
    ops = kernels.load_kernels()
    if ops is None or not ops.set_r16_batch_tiles(True):
        pytest.skip("no AMX int8 here (or no kernels): --ab-batch-tiles refuses to run and says so")
    calls = ops.r16_batch_tile_calls()
    batch_ab.main(["--batch", "8", "--tokens", "3", "--rounds", "1", "--ab-batch-tiles", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert [run["arm"] for run in report["runs"]] == ["tiles", "vnni"]
    for run in report["runs"]:
        # all 8 prompts arrive before the first step: one prompt step (the first token), then 2 decode steps
        assert len(run["prompt_steps"]) == 1 and run["prompt_steps"][0]["rows"] > 8 * 10, run
        assert run["decode_steps"] == 2 and run["decode_native_median_ms"] > 0, run
        assert run["tok_s"] > 0 and 0 <= run["rest_ms"] <= run["wall_ms"], run
    assert set(report["median_tok_s"]) == {"tiles", "vnni"}
    assert ops.r16_batch_tile_calls() > calls  # the tiles' arm (8 decode rows) ran in them


def test_lines_name_each_run_and_the_median(capsys, smollm2_dir):
    batch_ab.main(["--batch", "2", "--tokens", "3", "--rounds", "1"])
    out = capsys.readouterr().out
    assert re.search(r"^  round 1 as built: [\d.]+ tok/s; 1 prompt step\(s\) \d+ rows in 2 chunks \+ 0 decode rows "
                     r"\d+ ms; 2 decode steps, native median [\d.]+ ms", out, re.M), out
    assert re.search(r"^medians \(1-min load [\d.]+\): as built [\d.]+ tok/s$", out, re.M), out


def test_temperature_and_top_p_sample_each_token(capsys, smollm2_dir, monkeypatch):
    """--temperature / --top-p: the persona's sampling, each token through the sampler's row path (not
    the greedy one-call step), the settings in the report."""
    from engine.sampler import Sampler
    rows = []
    sample_row = Sampler._sample_row
    monkeypatch.setattr(Sampler, "_sample_row", lambda self, logits, seq: rows.append(seq.sampling)
                        or sample_row(self, logits, seq))
    batch_ab.main(["--batch", "1", "--tokens", "3", "--rounds", "1", "--temperature", "0.7", "--top-p", "0.9",
                   "--json"])
    report = json.loads(capsys.readouterr().out)
    assert (report["temperature"], report["top_p"]) == (0.7, 0.9)
    assert len(rows) >= 2 * 3 and all((p.temperature, p.top_p) == (0.7, 0.9) for p in rows)  # warm-up + run



def test_runs_count_their_steps_on_one_thread(capsys, smollm2_dir):
    """Each run reports its steps on one thread (the stall fallback); --no-stall-fallback makes it 0."""
    batch_ab.main(["--batch", "2", "--tokens", "4", "--rounds", "1", "--no-stall-fallback", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert [run["solo_steps"] for run in report["runs"]] == [0] and report["runs"][0]["decode_steps"] == 3
