"""The llama.cpp peer: the commands it runs and how it reads their output (stand-in tools print
output recorded from the real llama-bench / llama-batched-bench; building the real ones takes
minutes, so the build itself is exercised by ``voxlane bench engine --peer llama.cpp``, not here)."""
from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import llama_cpp_build, llama_cpp_peer

LLAMA_BENCH_JSON = [{"model_type": "llama 256M Q4_1", "n_prompt": 0, "n_gen": 16, "n_threads": 2,
                     "flash_attn": 1, "avg_ts": 201.5, "samples_ts": [201.5]}]
BATCHED_JSONL = ('{"n_kv_max": 512, "pp": 43, "tg": 8, "pl": 2, "n_kv": 102, "t_pp": 0.171, "speed_pp": 502.9, '
                 '"t_tg": 0.0645, "speed_tg": 248.0, "t": 0.2355, "speed": 433.1}')


def fake_tool(directory: Path, name: str, output: str) -> Path:
    """A script that records its arguments and prints ``output``."""
    script = directory / name
    script.write_text(f"#!/bin/sh\necho \"$@\" > {directory / (name + '.args')}\n"
                      f"env > {directory / (name + '.env')}\ncat <<'EOF'\n{output}\nEOF\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_llama_bench_and_batched_bench_are_run_and_read(tmp_path, monkeypatch):
    # our runs export these for torch; ggml's OpenMP team must not inherit them (they halve its speed)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    fake_tool(tmp_path, "llama-bench", json.dumps(LLAMA_BENCH_JSON))
    fake_tool(tmp_path, "llama-batched-bench", "main: n_kv_max = 512\n" + BATCHED_JSONL)
    gguf = tmp_path / "model.gguf"
    assert llama_cpp_peer.llama_bench(tmp_path, gguf, 2, 0, 16) == 201.5
    args = (tmp_path / "llama-bench.args").read_text().split()
    assert args == ["-m", str(gguf), "-p", "0", "-n", "16", "-t", "2", "-fa", "1", "-r", "1", "-o", "json"]
    assert abs(llama_cpp_peer.llama_batched(tmp_path, gguf, 2, 43, 8, 2) - 2 * 8 / 0.2355) < 1e-6
    args = (tmp_path / "llama-batched-bench.args").read_text().split()
    assert args[args.index("-npp") + 1] == "43" and args[args.index("-npl") + 1] == "2"
    for tool in ("llama-bench", "llama-batched-bench"):
        seen = (tmp_path / f"{tool}.env").read_text()
        assert "OMP_WAIT_POLICY" not in seen and "OMP_NUM_THREADS" not in seen and "PATH=" in seen


def test_build_cache_is_keyed_by_version_flags_and_cpu(monkeypatch, tmp_path):
    monkeypatch.setattr(llama_cpp_build.Path, "home", lambda: tmp_path)
    key_dir = llama_cpp_build.cache_dir()
    assert key_dir.parent == tmp_path / ".cache" / "voxlane" / "llama.cpp"
    assert llama_cpp_build.built_tools() is None  # nothing built yet: build() would download and compile
    (key_dir / "bin").mkdir(parents=True)
    for tool in llama_cpp_build.TOOLS:
        (key_dir / "bin" / tool).write_text("")
    assert llama_cpp_build.built_tools() == key_dir / "bin"
    assert llama_cpp_build.build() == key_dir / "bin"  # cached: returns at once
    monkeypatch.setattr(llama_cpp_build, "cpu_flags", lambda: "another cpu")
    assert llama_cpp_build.cache_dir() != key_dir


def test_peer_table_states_ratios_and_load():
    result = {"gguf": "model.gguf", "quant": "native", "load_avg": [1.0, 2.0],
              "ours": {"decode_tok_s": 240.0, "ttft_ms": 30.0, "prefill_tok_s": 900.0, "batch8_tok_s": 700.0},
              "llama.cpp": {"decode_tok_s": 200.0, "ttft_ms": 45.0, "prefill_tok_s": 600.0, "batch8_tok_s": 350.0},
              "ratios": {"decode_tok_s": 1.2, "ttft_ms": 1.5, "prefill_tok_s": 1.5, "batch8_tok_s": 2.0}}
    table = llama_cpp_peer.format_peer(result, SimpleNamespace(batch=8, runs=3, threads=2, tokens=128))
    assert "| decode tok/s, batch 1 | 240.0 | 200.0 | 1.20x |" in table
    assert "batch 8 aggregate" in table and "load average 1.0 at start, 2.0 at end" in table


def test_compare_measures_our_engine_against_the_tools_alternating(monkeypatch, tmp_path, smollm2_dir):
    """The whole comparison with our real engine (native weights) and stand-in llama.cpp tools: each
    figure of both sides, ratios oriented so > 1 favours ours."""
    from bench.engine_rows import BenchSettings
    from engine.native_weights import native_gguf_path

    fake_tool(tmp_path, "llama-bench", json.dumps(LLAMA_BENCH_JSON))
    fake_tool(tmp_path, "llama-batched-bench", BATCHED_JSONL)
    monkeypatch.setattr(llama_cpp_peer, "build_llama_cpp",
                        lambda smoke_gguf: (tmp_path, llama_cpp_build.VARIANTS[0]))
    monkeypatch.setattr(llama_cpp_peer, "PREFILL_PROMPT", 64)  # 512 in the real run; the same code path
    settings = BenchSettings(tokens=4, runs=1, batch=2, threads=2)
    result = llama_cpp_peer.compare(smollm2_dir, native_gguf_path(smollm2_dir), settings)
    assert set(result["ours"]) == set(result["llama.cpp"]) == {"decode_tok_s", "ttft_ms", "prefill_tok_s",
                                                               "batch2_tok_s"}
    assert all(value > 0 for value in result["ours"].values())
    assert result["llama.cpp"]["decode_tok_s"] == 201.5
    ours, theirs = result["ours"]["ttft_ms"], result["llama.cpp"]["ttft_ms"]
    assert result["ratios"]["ttft_ms"] == round(theirs / ours, 2)
    assert [len(v) for v in result["samples"]["ours"].values()] == [1, 1, 1, 1]


def test_a_row_the_peer_crashes_on_is_reported_and_the_others_are_measured(monkeypatch, tmp_path, smollm2_dir):
    """llama-bench died of SIGSEGV on prompt processing (this AMX machine's native build): that row has
    no llama.cpp figure and says why; decode and the batch row are still compared."""
    from bench.engine_rows import BenchSettings
    from engine.native_weights import native_gguf_path

    script = tmp_path / "llama-bench"  # prints a result for -p 0, crashes like the real one for -p N
    script.write_text("#!/bin/sh\nif [ \"$4\" != 0 ]; then echo 'repack: AMX tile' >&2; kill -SEGV $$; fi\n"
                      f"cat <<'EOF'\n{json.dumps(LLAMA_BENCH_JSON)}\nEOF\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    fake_tool(tmp_path, "llama-batched-bench", BATCHED_JSONL)
    monkeypatch.setattr(llama_cpp_peer, "build_llama_cpp",
                        lambda smoke_gguf: (tmp_path, llama_cpp_build.VARIANTS[0]))
    monkeypatch.setattr(llama_cpp_peer, "PREFILL_PROMPT", 64)
    settings = BenchSettings(tokens=4, runs=2, batch=2, threads=2)
    result = llama_cpp_peer.compare(smollm2_dir, native_gguf_path(smollm2_dir), settings)
    assert set(result["llama.cpp"]) == {"decode_tok_s", "batch2_tok_s"}
    assert result["ratios"]["ttft_ms"] is None and result["ratios"]["decode_tok_s"] > 0
    assert result["errors"]["ttft_ms"] == "llama-bench died of signal 11: repack: AMX tile"
    assert len(result["samples"]["ours"]["ttft_ms"]) == 2  # ours is still measured every round
    table = llama_cpp_peer.format_peer(result, settings)
    assert "| TTFT ms, 43-token prompt |" in table and "none: llama-bench died of signal 11" in table


def test_batched_bench_without_a_result_line_is_retried_once_then_reported(tmp_path):
    """It once exited 0 without its JSON line (load 5): a second try counts; two such runs are the
    row's failure (a CalledProcessError, which compare() reports per row), not a StopIteration that
    ended the whole comparison."""
    script = tmp_path / "llama-batched-bench"  # the first run prints nothing, later ones the result
    script.write_text(f"#!/bin/sh\nif [ -e {tmp_path}/ran ]; then echo '{BATCHED_JSONL}'; fi\ntouch {tmp_path}/ran\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    gguf = tmp_path / "model.gguf"
    assert abs(llama_cpp_peer.llama_batched(tmp_path, gguf, 2, 43, 8, 2) - 2 * 8 / 0.2355) < 1e-6
    fake_tool(tmp_path, "llama-batched-bench", "main: n_kv_max = 512")
    with pytest.raises(subprocess.CalledProcessError) as error:
        llama_cpp_peer.llama_batched(tmp_path, gguf, 2, 43, 8, 2)
    assert llama_cpp_peer.failure(error.value) == "llama-batched-bench exited with 0: no result line in its output, twice"
