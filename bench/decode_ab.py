"""Batch-1 (or batch-N) decode, several engine settings and llama.cpp, alternating in one run:
``python -m bench.decode_ab``.

Each arm is a ``bench.decode_profile`` run in its own process (one engine per process: different
weight modes, or a different source tree's kernels, never share one), or ``llama-bench`` on the
same GGUF; every round runs every arm once per thread count, so all of them see the same minutes of
a shared machine. Prints the median ms per token of each arm and thread count, every sample with
the 1-minute load average taken right after it, and the ratios to the first arm.

    python -m bench.decode_ab --model qwen2.5-0.5b-instruct --threads 1,2 --rounds 3 \\
        --arm int8 "--quant int8" --arm native "--quant native" \\
        --arm native+i8act "--quant native --int8-activations" --llama-cpp
    # a change against a git revision's code (each revision exported once to a temporary tree):
    python -m bench.decode_ab --rev-arm before HEAD~1 "--quant native --int8-activations" \\
        --arm after "--quant native --int8-activations"
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # this source tree


def export_tree(revision: str, into: Path) -> Path:
    """The files of ``revision`` of this repository, unpacked under ``into`` (git archive)."""
    into.mkdir(parents=True)
    archive = into / "tree.tar"
    subprocess.run(["git", "-C", str(HERE), "archive", "-o", str(archive), revision], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


def json_in(tree: Path, cmd: list[str]) -> dict:
    """The JSON object ``cmd`` prints, run in its own process on ``tree``'s sources (a --rev-arm)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} in {tree} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout[done.stdout.index("{"):])


def profile_ms(tree: Path, model: str, threads: int, steps: int, batch: int, args: str) -> tuple[float, int, float]:
    """One decode_profile run in ``tree`` -> (wall ms per decode step, steps the step pool ran on one
    thread because its helpers stalled: the engine's own fallback under contention, the process's CPU ms
    per step (all threads; nan where that tree's decode_profile does not print it)). The CPU time is
    the measure on a loaded host: one thread's wall moves with the neighbours, its CPU time much less."""
    cmd = [sys.executable, "-m", "bench.decode_profile", "--model", model, "--threads", str(threads), "--steps",
           str(steps), "--batch", str(batch), "--no-phase-profile", "--json", *shlex.split(args)]
    result = json_in(tree, cmd)
    return float(result["ms_per_step"]), int(result.get("solo_steps", 0)), float(result.get("cpu_ms_per_step", "nan"))


def llama_ms(model: str, threads: int, steps: int) -> tuple[float, int]:
    """llama-bench's decode of ``steps`` tokens (``-p 0 -n steps -fa 1``) on the model's GGUF -> ms per token."""
    from app.model_store import resolve
    from bench.llama_cpp_build import build
    from bench.llama_cpp_peer import llama_bench
    from engine.native_weights import native_gguf_path

    gguf = native_gguf_path(resolve(model, "llm"))
    return 1e3 / llama_bench(build(smoke_gguf=gguf), gguf, threads, 0, steps), 0, float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.decode_ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-0.5b-instruct")
    parser.add_argument("--threads", default="2", help="comma-separated thread counts, e.g. 1,2")
    parser.add_argument("--steps", type=int, default=32, help="decode steps per sample (llama-bench: -n)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--arm", nargs=2, action="append", default=[], metavar=("LABEL", "ARGS"),
                        help="decode_profile arguments of one setting, run in this tree (as it is on disk)")
    parser.add_argument("--rev-arm", nargs=3, action="append", default=[], metavar=("LABEL", "REV", "ARGS"),
                        help="the same in the tree of git revision REV")
    parser.add_argument("--llama-cpp", action="store_true", help="also llama-bench (batch 1 only; built on demand)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    with tempfile.TemporaryDirectory(prefix="voxlane-decode-ab-") as tmp:
        trees = {rev: export_tree(rev, Path(tmp) / f"rev{i}") for i, rev in enumerate(dict.fromkeys(
            rev for _, rev, _ in args.rev_arm))}
        arms = [(label, HERE, a) for label, a in args.arm] + [(label, trees[rev], a) for label, rev, a in args.rev_arm]
        measures = {label: (lambda t, tree=tree, a=a: profile_ms(tree, args.model, t, args.steps, args.batch, a))
                    for label, tree, a in arms}
        if args.llama_cpp:
            measures["llama.cpp"] = lambda t: llama_ms(args.model, t, args.steps)
        # per arm and thread count: (wall ms, load, steps on one thread, CPU ms) per sample
        samples: dict[str, dict[int, list[tuple[float, float, int, float]]]] = {k: {t: [] for t in threads} for k in measures}
        for label, measure in measures.items():  # warm-up: builds (kernels, llama.cpp), page cache
            measure(threads[0])
        for r in range(args.rounds):
            for t in threads:
                for label, measure in measures.items():
                    ms, solo, cpu = measure(t)
                    samples[label][t].append((ms, os.getloadavg()[0], solo, cpu))
                    print(f"[ab] round {r + 1} {t} thr {label}: {ms:.2f} ms, {cpu:.2f} ms CPU (load "
                          f"{os.getloadavg()[0]:.2f}{f', {solo} steps on one thread' if solo else ''})",
                          file=sys.stderr, flush=True)
    medians = {label: {t: statistics.median(s[0] for s in by) for t, by in by_t.items()}
               for label, by_t in samples.items()}
    cpu_medians = {label: {t: statistics.median(s[3] for s in by) for t, by in by_t.items()}
                   for label, by_t in samples.items()}
    result = {"model": args.model, "batch": args.batch, "steps": args.steps, "rounds": args.rounds,
              "median_ms": medians, "median_cpu_ms": cpu_medians, "samples": samples}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    first = next(iter(medians))
    print(f"{args.model}, batch {args.batch}, {args.steps} steps per sample, {args.rounds} alternating rounds; "
          f"median ms per decode step (tok/s), ratio to {first}, then the median CPU ms per step (all threads) "
          f"and its ratio; samples as ms@load, with /sN when N of the steps ran on one thread (the step pool's "
          f"fallback when its helpers stall under contention)")
    for t in threads:
        for label in medians:
            ms, cpu = medians[label][t], cpu_medians[label][t]
            each = ", ".join(f"{m:.1f}@{load:.1f}{f'/s{solo}' if solo else ''}" for m, load, solo, _ in samples[label][t])
            print(f"  {t} thr  {label:28s} {ms:8.2f} ms ({1e3 / ms:6.1f} tok/s)  x{ms / medians[first][t]:.2f}  "
                  f"CPU {cpu:7.2f} ms x{cpu / cpu_medians[first][t]:.2f}  [{each}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
