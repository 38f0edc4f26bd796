"""The engine benchmark runs end to end on its shortened setting (figures are printed, not asserted)."""
from __future__ import annotations

import json

from bench import engine as bench


def test_bench_quick_json(capsys):
    assert bench.main(["--quick", "--json", "--groups", "baseline,fp32,int8,transformers-int8,conversation,quality"]) == 0
    result = json.loads(capsys.readouterr().out)
    names = [r["name"] for r in result["rows"]]
    assert names == ["baseline (no KV cache)", "+ KV cache", "+ batching (batch 2)", "+ INT8",
                     "+ INT8 + batching (batch 2)", "transformers generate, int8 quantize_dynamic",
                     "transformers generate, int8 quantize_dynamic (batch 2)"]
    for r in result["rows"]:
        assert r["tok_s_aggregate"] > 0 and r["ms_per_token"] > 0 and r["rss_mb"] > 0
    assert result["ratios"]["int8_weights_vs_fp32_weights"] <= 0.35
    assert len(result["conversation_ttft_ms"]) == 2
    assert set(result["quality"]) == {"engine int8", "engine int8, pure-torch path", "quantize_dynamic int8"}
    print(bench.format_table(result))


def test_bench_table_and_arguments(capsys):
    args = bench.parse_args(["--quick"])
    assert (args.tokens, args.runs, args.batch, args.in_process) == (8, 1, 2, True)
    assert "llama-cpp" not in args.groups
    assert bench.main(["--quick", "--groups", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "| + KV cache |" in out and "torch.set_num_threads(2)" in out
