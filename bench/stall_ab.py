"""The step pool's stall fallback under made-up contention, arms alternating in one run:
``python -m bench.stall_ab``.

Each arm is one engine in its own process (SmolLM2 native + int16 activations, 2 threads, 8 slots: as
``engine_rows``), kept for the whole run as an app keeps it (the fallback's state carries from sample to
sample): this tree, a git revision's tree (``--rev-arm``) and this tree with the fallback off
(``--off-arm``). Each round runs, per load, every arm once per kind of sample, the arms' order reversed
every other round: ``one`` is one stream of 128 greedy tokens (decode tok/s, the peer table's row), ``batch``
8 streams at once (aggregate tok/s, prefills included). Loads, started for that part of the round and
stopped after it: ``quiet`` (none of ours), ``bursts`` (a busy loop of 20-50 ms every 0.5 s on a random
core: a neighbour's short disturbance), ``neighbour`` (one busy loop: a neighbour's one-thread job on one of
the two cores, load +1), ``sustained`` (two busy loops: both cores taken, load +2).
Prints every sample (tok/s, steps the fallback ran alone, the process's CPU ms, the 1-min load) and the
medians with their spread. The loads take CPU from everyone on the machine: keep runs short.

    python -m bench.stall_ab --rev-arm main main --off-arm --rounds 5
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # this source tree
LOADS = ("quiet", "bursts", "sustained")  # the default loads; "neighbour" when asked for


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def load_main(kind: str, seed: int) -> None:
    """A load process: ``bursts`` (20-50 ms busy every 0.5 s, each on a random core) or ``spin`` (busy)."""
    if kind == "spin":
        while True:
            spin(3600)
    rng = random.Random(seed)
    cpus = sorted(os.sched_getaffinity(0))
    while True:
        time.sleep(0.5)
        os.sched_setaffinity(0, {rng.choice(cpus)})
        spin(rng.uniform(0.020, 0.050))


def worker_main(model: str, tokens: int, fallback: bool) -> None:
    """One engine of the tree on PYTHONPATH; a line 'one' / 'batch' on stdin -> a JSON line of its sample."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from app.model_store import resolve
    from bench.engine_rows import SHORT_PROMPT, batch_prompts
    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from engine.sampling_params import SamplingParams

    config = EngineConfig(dtype="float32", quant="native", max_batch_size=8, num_slots=8, max_seq_len=1024,
                          admission_window_ms=0, prefill_chunk_tokens=512, num_threads=2, int16_activations=True)
    engine = LLMEngine(resolve(model, "llm"), config)
    greedy = SamplingParams(temperature=0.0, max_tokens=tokens)
    decoder = engine.runner.decoder
    if not fallback:
        decoder.set_stall_fallback(False)

    def one() -> float:
        stream = engine.submit(SHORT_PROMPT, greedy, ignore_eos=True)
        stream.text()
        return (len(stream.output_ids) - 1) / (stream.finished_at - stream.first_token_at)

    def batch() -> float:
        start = time.perf_counter()
        streams = [engine.submit(p, greedy, ignore_eos=True) for p in batch_prompts(8)]
        for s in streams:
            s.text()
        return sum(len(s.output_ids) for s in streams) / (max(s.finished_at for s in streams) - start)

    try:
        one(), batch()  # warm-up
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            if line.strip() not in ("one", "batch"):
                break
            solo, cpu = decoder.solo_steps(), time.process_time()
            tok_s = one() if line.strip() == "one" else batch()
            print(json.dumps({"tok_s": tok_s, "solo": decoder.solo_steps() - solo,
                              "cpu_ms": (time.process_time() - cpu) * 1e3, "load": os.getloadavg()[0]}), flush=True)
    finally:
        engine.close()


class Arm:
    """A worker process of one arm: an engine of ``tree``'s sources (this file run by path, so a tree
    without it works too)."""

    def __init__(self, label: str, tree: Path, model: str, tokens: int, fallback: bool):
        self.label = label
        env = {**os.environ, "PYTHONPATH": str(tree)}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--model", model, "--tokens", str(tokens),
               *([] if fallback else ["--no-stall-fallback"])]
        self.proc = subprocess.Popen(cmd, cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self.proc.stdout.readline()
        if not ready.strip():
            raise RuntimeError(f"arm {label}: the engine did not start (exit {self.proc.wait()})")

    def sample(self, kind: str) -> dict:
        self.proc.stdin.write(kind + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def start_load(load: str, seed: int) -> list[subprocess.Popen]:
    me = [sys.executable, str(Path(__file__).resolve()), "--load"]
    if load == "bursts":
        return [subprocess.Popen([*me, "bursts", "--seed", str(seed)])]
    if load == "neighbour":
        return [subprocess.Popen([*me, "spin"])]
    if load == "sustained":
        return [subprocess.Popen([*me, "spin"]) for _ in range(2)]
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stall_ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128, help="greedy tokens per stream")
    parser.add_argument("--loads", default=",".join(LOADS), help="comma-separated: quiet, bursts, neighbour (not by default), sustained")
    parser.add_argument("--kinds", default="one,batch", help="comma-separated: one (a stream), batch (8 streams)")
    parser.add_argument("--label", default="this", help="this tree's arm")
    parser.add_argument("--rev-arm", nargs=2, action="append", default=[], metavar=("LABEL", "REV"),
                        help="an arm of git revision REV's tree")
    parser.add_argument("--off-arm", action="store_true", help="also this tree with the stall fallback off")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-stall-fallback", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--load", choices=("bursts", "spin"), help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.load:
        load_main(args.load, args.seed)
        return 0
    if args.worker:
        worker_main(args.model, args.tokens, not args.no_stall_fallback)
        return 0
    from bench.decode_ab import export_tree

    loads, kinds = args.loads.split(","), args.kinds.split(",")
    samples: dict[tuple[str, str, str], list[dict]] = {}
    arms: list[Arm] = []
    with tempfile.TemporaryDirectory(prefix="voxlane-stall-ab-") as tmp:
        try:
            arms.append(Arm(args.label, HERE, args.model, args.tokens, True))
            for i, (label, rev) in enumerate(args.rev_arm):
                arms.append(Arm(label, export_tree(rev, Path(tmp) / f"rev{i}"), args.model, args.tokens, True))
            if args.off_arm:
                arms.append(Arm(f"{args.label} off", HERE, args.model, args.tokens, False))
            for r in range(args.rounds):
                for load in loads:
                    procs = start_load(load, r)
                    try:
                        time.sleep(0.3)
                        for kind in kinds:
                            for arm in (arms if r % 2 == 0 else arms[::-1]):
                                s = arm.sample(kind)
                                samples.setdefault((load, kind, arm.label), []).append(s)
                                print(f"[stall_ab] round {r + 1} {load} {kind} {arm.label}: {s['tok_s']:.1f} tok/s, "
                                      f"{s['solo']} steps alone, {s['cpu_ms']:.0f} ms CPU, load {s['load']:.2f}",
                                      file=sys.stderr, flush=True)
                    finally:
                        for p in procs:
                            p.kill()
                            p.wait()
        finally:
            for arm in arms:
                arm.close()
    first = arms[0].label
    rows = []
    for (load, kind, label), s in samples.items():
        tok = [x["tok_s"] for x in s]
        base = statistics.median(x["tok_s"] for x in samples[(load, kind, first)])
        rows.append({"load": load, "kind": kind, "arm": label, "median_tok_s": statistics.median(tok),
                     "min_tok_s": min(tok), "max_tok_s": max(tok), "ratio": statistics.median(tok) / base,
                     "median_solo": statistics.median(x["solo"] for x in s), "max_solo": max(x["solo"] for x in s),
                     "load_avg": [min(x["load"] for x in s), max(x["load"] for x in s)], "samples": s})
    if args.json:
        print(json.dumps({"model": args.model, "rounds": args.rounds, "rows": rows}, indent=2))
        return 0
    print(f"{args.model}, 2 threads, {args.tokens} tokens a stream, {args.rounds} alternating rounds; median tok/s "
          f"[min-max], ratio to {first}, steps alone per sample (median, max), 1-min load")
    for row in rows:
        print(f"  {row['load']:9s} {row['kind']:5s} {row['arm']:12s} {row['median_tok_s']:7.1f} "
              f"[{row['min_tok_s']:.1f}-{row['max_tok_s']:.1f}]  x{row['ratio']:.2f}  alone {row['median_solo']:.0f}, "
              f"max {row['max_solo']}  load {row['load_avg'][0]:.1f}-{row['load_avg'][1]:.1f}")
    return 0


if __name__ == "__main__":
    # Run by path (workers, loads): not this folder first on the path (its engine.py is not the package).
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    sys.exit(main())
