"""``voxlane bench engine`` / ``python -m bench.engine``: the seed article's table, measured here.

Rows: baseline (no KV cache) -> + KV cache -> + batching -> + INT8 -> + INT8 + batching, and in the
same run the peers on the same model: transformers ``generate`` (fp32, and ``quantize_dynamic``
int8), llama.cpp when ``llama_cpp`` is importable. Greedy, ``--tokens`` new tokens (EOS ignored),
median of ``--runs`` runs after a warm-up, ``torch.set_num_threads(--threads)``. Each group runs in
its own process (clean resident-memory figures) unless ``--in-process`` (implied by ``--quick``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict

GROUPS = ("baseline", "fp32", "int8", "native", "transformers-fp32", "transformers-int8", "llama-cpp", "conversation", "quality")
EXTRA_GROUPS = ("native-int16",)  # only when asked for by name (--groups)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="voxlane bench engine", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="packaged model name or HF directory")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per generation (default 128)")
    parser.add_argument("--runs", type=int, default=3, help="measured runs per figure, median reported (default 3)")
    parser.add_argument("--batch", type=int, help="streams in the batching rows (default 8; 2 with --quick)")
    parser.add_argument("--prefill-tokens", type=int, default=500, help="prompt length for prefill tok/s")
    parser.add_argument("--groups", default=",".join(GROUPS), help=f"comma-separated subset of {','.join(GROUPS)} (default: all), or {','.join(EXTRA_GROUPS)}")
    parser.add_argument("--quick", action="store_true",
                        help="shortened settings for tests (8 tokens, 1 run, batch 2 unless --batch says)")
    parser.add_argument("--in-process", action="store_true", help="run all groups in this process")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--peer", choices=["llama.cpp"], help="instead: our native-GGUF engine against a natively "
                        "built llama.cpp on the same GGUF, alternating (builds llama.cpp once, ~6 min)")
    parser.add_argument("--quant", default="native", help="our weights in the --peer comparison (native|int8)")
    parser.add_argument("--int8-activations", action="store_true",
                        help="--peer: ours with EngineConfig.int8_activations (needs --quant native)")
    parser.add_argument("--bf16-activations", action="store_true",
                        help="--peer: ours with EngineConfig.bf16_activations (needs --quant native)")
    parser.add_argument("--int16-activations", action="store_true",
                        help="--peer: ours with EngineConfig.int16_activations (needs --quant native)")
    parser.add_argument("--_group", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.tokens, args.runs, args.batch, args.prefill_tokens = min(args.tokens, 8), 1, args.batch or 2, 64
        args.in_process = True
        if args.groups == ",".join(GROUPS):
            args.groups = ",".join(g for g in GROUPS if g != "llama-cpp")
    args.batch = args.batch or 8
    return args


def run_group(group: str, model_dir, settings, quick: bool) -> dict:
    """Measure one group in this process -> {"rows": [...], ...}."""
    import torch

    from bench import engine_rows as rows

    torch.set_num_threads(settings.threads)
    if group == "baseline":
        return {"rows": [rows.no_cache_row(model_dir, settings)]}
    if group == "fp32":
        return {"rows": rows.engine_rows(model_dir, "none", settings, "")}
    if group == "int8":
        return {"rows": rows.engine_rows(model_dir, "int8", settings, "INT8")}
    if group == "native":  # the GGUF's own blocks (Q4_1 + Q8_0 for SmolLM2)
        return {"rows": rows.engine_rows(model_dir, "native", settings, "native GGUF")}
    if group == "native-int16":  # the same with EngineConfig.int16_activations (its weights repacked in 16-row groups)
        return {"rows": rows.engine_rows(model_dir, "native", settings, "int16-activation native GGUF",
                                         int16_activations=True)}
    if group in ("transformers-fp32", "transformers-int8"):
        return {"rows": rows.transformers_rows(model_dir, settings, int8=group.endswith("int8"))}
    if group == "llama-cpp":
        from app.model_store import smollm2_gguf_path
        from bench.llama_cpp import llama_cpp_rows
        from bench.gguf_requant import requantize

        packaged = smollm2_gguf_path()
        q8 = model_dir.parent / "bench" / (packaged.stem.rsplit(".", 1)[0] + ".Q8_0.gguf")  # made once
        if not q8.exists():
            q8.parent.mkdir(parents=True, exist_ok=True)
            requantize(packaged, q8, "Q8_0")
        return {"rows": llama_cpp_rows(packaged, settings, "Q4_1 GGUF as packaged")
                + llama_cpp_rows(q8, settings, "Q8_0 GGUF requantized from it")}
    if group == "conversation":
        return {"conversation_ttft_ms": rows.conversation_ttft(model_dir, settings, turns=2 if quick else 5)}
    if group == "quality":
        from bench.quality_report import quality_report

        return {"quality": quality_report(model_dir, num_prompts=1 if quick else 5, num_tokens=8 if quick else 48)}
    raise ValueError(f"unknown group {group!r}")


def run_isolated(group: str, argv_settings: list[str]) -> dict:
    """The group in a fresh interpreter, so its resident memory is its own."""
    cmd = [sys.executable, "-m", "bench.engine", "--_group", group, "--json", *argv_settings]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode < 0 and group == "llama-cpp":  # killed by a signal: llama.cpp's AMX path here
        print(f"[bench] llama-cpp crashed (signal {-out.returncode}); again without its AMX/repack buffers",
              file=sys.stderr, flush=True)
        out = subprocess.run(cmd, capture_output=True, text=True, env={**env, "VOXLANE_LLAMA_CPP_NO_EXTRA_BUFFERS": "1"})
    if out.returncode != 0:
        raise RuntimeError(f"bench group {group} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def ratios(result: dict) -> dict:
    """The figures the targets are stated in (our/peer and our/our)."""
    by_name = {r["name"]: r for r in result["rows"]}

    def rate(prefix: str, key: str = "tok_s_stream"):
        for name, r in by_name.items():
            if name.startswith(prefix) and "batch" not in name[len(prefix):]:
                return r[key]
        return None

    def batch_rate(prefix: str):
        return next((r["tok_s_aggregate"] for n, r in by_name.items() if n.startswith(prefix) and "(batch" in n), None)

    def div(a, b):
        return round(a / b, 2) if a and b else None

    int8 = rate("+ INT8")
    out = {
        "kv_cache_vs_no_cache": div(rate("+ KV cache"), rate("baseline")),
        "int8_vs_transformers_quantize_dynamic": div(int8, rate("transformers generate, int8")),
        "int8_vs_transformers_fp32": div(int8, rate("transformers generate, fp32")),
        "int8_vs_llama_cpp_q8_0": div(int8, rate("llama.cpp (Q8_0")),
        "int8_vs_llama_cpp_q4_1": div(int8, rate("llama.cpp (Q4_1")),
        "int8_batch_aggregate_vs_int8_batch1": div(batch_rate("+ INT8 + batching"), int8),
        "int8_batch_aggregate_vs_transformers_int8_batch": div(batch_rate("+ INT8 + batching"),
                                                               batch_rate("transformers generate, int8")),
        "int8_batch_aggregate_vs_llama_cpp_q8_0_batch": div(batch_rate("+ INT8 + batching"),
                                                            batch_rate("llama.cpp (Q8_0")),
        "int8_weights_vs_fp32_weights": div(rate("+ INT8", "weights_mb"), rate("+ KV cache", "weights_mb")),
        "native_vs_int8": div(rate("+ native GGUF"), int8),
        "native_batch_aggregate_vs_native_batch1": div(batch_rate("+ native GGUF + batching"), rate("+ native GGUF")),
    }
    turns = result.get("conversation_ttft_ms")
    if turns and len(turns) > 1:
        out["last_turn_ttft_vs_first"] = div(turns[-1], turns[0])
    return out


def format_table(result: dict) -> str:
    def f(value, digits=1):
        return "" if value is None else f"{value:.{digits}f}"

    lines = ["| configuration | ms/token | tok/s per stream | tok/s aggregate | TTFT ms | prefill tok/s | weights MB | RSS MB |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['name']} | {f(r['ms_per_token'], 2)} | {f(r['tok_s_stream'])} | {f(r['tok_s_aggregate'])} | "
                     f"{f(r['ttft_ms'])} | {f(r['prefill_tok_s'], 0)} | {f(r['weights_mb'], 0)} | {f(r['rss_mb'], 0)} |")
    s = result["settings"]
    lines.append("")
    lines.append(f"Settings: {s['tokens']} greedy new tokens (EOS ignored), median of {s['runs']} runs after a warm-up, "
                 f"torch.set_num_threads({s['threads']}), batch {s['batch']}, prefill prompt ~{s['prefill_tokens']} tokens; "
                 f"{result['machine']}; 1-min load average {result.get('load_avg_start')} at start, "
                 f"{result.get('load_avg_end')} at end (other work on the machine slows every row).")
    if result.get("conversation_ttft_ms"):
        lines.append("Conversation TTFT by turn (ms, one session): "
                     + ", ".join(f"{t:.0f}" for t in result["conversation_ttft_ms"]))
    if result.get("quality"):
        for name, q in result["quality"].items():
            lines.append(f"Quality {name} vs fp32: greedy top-1 agreement {q['top1_agreement']:.3f}, mean KL "
                         f"{q['mean_kl']:.4f}, first answer token same {q['first_token_same']:.2f} "
                         f"({q['num_positions']} positions)")
    lines.append("Ratios: " + ", ".join(f"{k} {v}" for k, v in result["ratios"].items() if v is not None))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    from app.model_store import resolve
    from bench.engine_rows import BenchSettings

    model_dir = resolve(args.model, "llm")
    settings = BenchSettings(tokens=args.tokens, runs=args.runs, batch=args.batch,
                             prefill_tokens=args.prefill_tokens, threads=args.threads)
    if args.peer:
        from bench.llama_cpp_peer import compare, format_peer
        from engine.native_weights import native_gguf_path

        result = compare(model_dir, native_gguf_path(model_dir), settings, args.quant, log=sys.stderr,
                         int8_activations=args.int8_activations, bf16_activations=args.bf16_activations,
                         int16_activations=args.int16_activations)
        print(json.dumps(result, indent=2) if args.json else format_peer(result, settings))
        return 0
    if args._group:  # child process of an isolated run
        print(json.dumps(run_group(args._group, model_dir, settings, args.quick)))
        return 0
    child_argv = ["--model", args.model, "--threads", str(args.threads), "--tokens", str(args.tokens),
                  "--runs", str(args.runs), "--batch", str(args.batch), "--prefill-tokens", str(args.prefill_tokens)]
    result: dict = {"rows": [], "settings": asdict(settings),
                    "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
                               f"torch {__import__('torch').__version__}",
                    "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "load_avg_start": round(os.getloadavg()[0], 2)}
    for group in [g for g in args.groups.split(",") if g]:
        print(f"[bench] {group} ...", file=sys.stderr, flush=True)
        part = run_group(group, model_dir, settings, args.quick) if args.in_process else run_isolated(group, child_argv)
        result["rows"] += part.pop("rows", [])
        result.update(part)
    result["load_avg_end"] = round(os.getloadavg()[0], 2)
    result["ratios"] = ratios(result)
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
