"""Where a prompt's milliseconds go: ``python -m bench.prompt_profile``.

Prefills prompts of ``--tokens`` tokens (default 43 and 512: ``bench engine``'s TTFT and prefill
prompts' sizes) through the engine's runner, one native call each, and prints per prompt size the
median wall ms of a prefill without profiling, and of one with ``NativeDecoder.set_profiling``: the CPU
ms per phase kind summed over threads, and ``waits`` = threads x wall - the tasks' CPU (the step pool's
hand-offs and idle threads). Sizes alternate within each round.

``--rev-arm LABEL REV`` (repeatable) runs the same in the tree of git revision REV (exported once, as
``bench.decode_ab``'s) in its own process, alternating with this tree's process round by round: a
change's before / after with the load printed per sample.

    python -m bench.prompt_profile --quant native --int16-activations --threads 1 --rounds 3
    python -m bench.prompt_profile --int16-activations --rev-arm main main --rounds 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__":  # run by path (run_in): not this directory first on the path (its engine.py)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from bench.decode_profile import PHASES  # noqa: E402

HERE = Path(__file__).resolve().parent.parent


def add_prompt_arguments(parser: argparse.ArgumentParser, samples: int, samples_help: str) -> None:
    """The options of a prompt measurement in one engine (this module's and bench.step_options_ab's)."""
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--quant", default="native")
    parser.add_argument("--int8-activations", action="store_true")
    parser.add_argument("--bf16-activations", action="store_true")
    parser.add_argument("--int16-activations", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", default="43,512", help="prompt sizes, comma-separated")
    parser.add_argument("--samples", type=int, default=samples, help=samples_help)
    parser.add_argument("--no-stall-fallback", action="store_true",
                        help="always the threads asked for (the step pool's one-thread fallback off)")


def prompt_engine(args):
    """A synchronous engine of add_prompt_arguments' settings (one slot's prompts of up to 1,024 tokens in
    one chunk) -> (engine, its native decoder)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from app.model_store import resolve
    from engine.config import EngineConfig
    from engine.engine import LLMEngine

    torch.set_num_threads(args.threads)
    engine = LLMEngine(resolve(args.model, "llm"), EngineConfig(quant=args.quant, max_seq_len=1024, num_slots=2,
                                                                 max_batch_size=1, num_threads=args.threads,
                                                                 prefill_chunk_tokens=1024,
                                                                 int8_activations=args.int8_activations,
                                                                 bf16_activations=args.bf16_activations,
                                                                 int16_activations=args.int16_activations),
                       background=False)
    decoder = getattr(engine.runner, "decoder", None)
    if decoder is None:
        raise SystemExit("no native decoder (kernels missing?)")
    if args.no_stall_fallback:
        decoder.set_stall_fallback(False)
    return engine, decoder


def prompt_ids(n: int, seed: int) -> list[int]:
    """n prompt token ids, another prompt for each seed (so no prompt finds another's cache)."""
    return [300 + (7 * i + 13 * seed) % 5000 for i in range(n)]


def profile(args) -> dict:
    """This process: {tokens: {"wall_ms": [...], "profiled_wall_ms": [...], "cpu_ms": {phase: [...]}}}."""
    engine, decoder = prompt_engine(args)
    runner = engine.runner
    sizes = [int(t) for t in args.tokens.split(",")]
    seed = [0]

    def prefill_ms(n: int) -> float:
        seed[0] += 1
        ids = prompt_ids(n, seed[0])
        start = time.perf_counter()
        runner.prefill(0, ids, 0)
        return (time.perf_counter() - start) * 1e3

    out = {n: {"wall_ms": [], "profiled_wall_ms": [], "cpu_ms": {p: [] for p in PHASES + ("waits",)}} for n in sizes}
    for n in sizes:  # warm-up
        prefill_ms(n)
    for _ in range(args.samples):
        for n in sizes:
            out[n]["wall_ms"].append(prefill_ms(n))
            decoder.set_profiling(True)
            wall = prefill_ms(n)
            cpu = decoder.profile_ms()
            decoder.set_profiling(False)
            out[n]["profiled_wall_ms"].append(wall)
            for p, ms in zip(PHASES, cpu):
                out[n]["cpu_ms"][p].append(ms)
            out[n]["cpu_ms"]["waits"].append(args.threads * wall - sum(cpu))
    result = {"load_avg": os.getloadavg()[0], "solo_steps": decoder.solo_steps(), "sizes": out}
    engine.close()
    return result


def run_in(tree: Path, args) -> dict:
    """``profile`` in its own process with ``tree``'s engine (this file runs there, so a revision from
    before it can be measured) -> its result."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--json", "--model", args.model, "--quant", args.quant,
           "--threads", str(args.threads), "--tokens", args.tokens, "--samples", str(args.samples), "--rounds", "1"]
    cmd += [f"--{flag.replace('_', '-')}" for flag in ("int8_activations", "bf16_activations", "int16_activations",
                                                       "no_stall_fallback") if getattr(args, flag)]
    from bench.decode_ab import json_in

    return json_in(tree, cmd)


def median_of(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.prompt_profile", description=__doc__.split("\n\n")[0])
    add_prompt_arguments(parser, 3, "prefills per size, arm and round")
    parser.add_argument("--rounds", type=int, default=3, help="with --rev-arm: alternating rounds")
    parser.add_argument("--rev-arm", nargs=2, action="append", default=[], metavar=("LABEL", "REV"),
                        help="the same in the tree of git revision REV, in its own process, alternating")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.json:  # one process's figures (also what --rev-arm runs)
        print(json.dumps(profile(args)))
        return 0
    from bench.decode_ab import export_tree

    with tempfile.TemporaryDirectory(prefix="voxlane-prompt-profile-") as tmp:
        arms = {"this tree": HERE} | {label: export_tree(rev, Path(tmp) / f"rev{i}")
                                      for i, (label, rev) in enumerate(args.rev_arm)}
        results: dict[str, list[dict]] = {label: [] for label in arms}
        print(f"load before: {os.getloadavg()[0]:.2f}", flush=True)
        for r in range(args.rounds):
            for label, tree in (arms.items() if r % 2 == 0 else reversed(list(arms.items()))):
                res = run_in(tree, args)
                results[label].append(res)
                walls = ", ".join(f"{n} tok {median_of(s['wall_ms']):.1f} ms" for n, s in res["sizes"].items())
                print(f"round {r + 1} {label}: {walls} (load {res['load_avg']:.2f}"
                      f"{', %d steps on one thread' % res['solo_steps'] if res['solo_steps'] else ''})", flush=True)
    sizes = [str(int(t)) for t in args.tokens.split(",")]
    print(f"{args.model}, {args.quant}{', int16 activations' if args.int16_activations else ''}"
          f"{', int8 activations' if args.int8_activations else ''}{', bf16 activations' if args.bf16_activations else ''}, "
          f"{args.threads} thread(s), {args.rounds} rounds x {args.samples} prefills; medians over all samples, ms")
    for n in sizes:
        print(f"\n{n}-token prompt" + "".join(f" | {label:>12s}" for label in arms))
        rows = [("wall", lambda s: s["wall_ms"]), ("wall, profiled", lambda s: s["profiled_wall_ms"])]
        rows += [(p, lambda s, p=p: s["cpu_ms"][p]) for p in PHASES + ("waits",)]
        for name, pick in rows:
            cells = []
            for label in arms:
                values = [v for res in results[label] for v in pick(res["sizes"][n])]
                cells.append(f"{median_of(values):12.2f}")
            print(f"  {name:16s}" + "".join(f" | {c}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
