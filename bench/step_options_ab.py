"""Same-process A/B of the one-call step's prompt options, alternating prefill by prefill:
``python -m bench.step_options_ab``.

Arms (NativeDecoder switches, every other setting alike): ``before`` (the last layer for every row, each
attention task widening its own fp16 keys: the code before both), ``last rows`` (set_last_rows_only: the
last layer after its qkv for the logits rows only), ``both`` (and set_widen_once: a prompt's fp16 keys
widened once per layer and kv head). Each sample is one prefill per arm and prompt size, the arms' order
rotating, so the neighbours' load falls on every arm alike; per arm and size the medians of the process's
CPU ms (time.process_time: what the step's threads ran, not the time others ran on our cores), of the wall
ms, and of the profile's per-phase ms (set_profiling; times within tasks). Prints the load before and after.

    python -m bench.step_options_ab --int16-activations --threads 1 --tokens 43,512 --samples 30
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from bench.decode_profile import PHASES
from bench.prompt_profile import add_prompt_arguments, prompt_engine, prompt_ids

ARMS = {"before": (False, False), "last rows": (True, False), "both": (True, True)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_prompt_arguments(parser, 30, "prefills per arm and size")
    args = parser.parse_args(argv)
    engine, decoder = prompt_engine(args)
    runner = engine.runner
    sizes = [int(t) for t in args.tokens.split(",")]
    print(f"load before: {os.getloadavg()[0]:.2f}", flush=True)
    seed = [0]

    def prefill(n: int, arm: str, profiled: bool) -> tuple[float, float, list[float]]:
        only, once = ARMS[arm]
        decoder.set_last_rows_only(only)
        decoder.set_widen_once(once)
        seed[0] += 1
        ids = prompt_ids(n, seed[0])
        decoder.set_profiling(profiled)
        wall, cpu = time.perf_counter(), time.process_time()
        runner.prefill(0, ids, 0)
        wall, cpu = (time.perf_counter() - wall) * 1e3, (time.process_time() - cpu) * 1e3
        phases = decoder.profile_ms() if profiled else []
        decoder.set_profiling(False)
        return wall, cpu, phases

    arms = list(ARMS)
    out = {(arm, n): {"wall": [], "cpu": [], "phases": []} for arm in arms for n in sizes}
    for n in sizes:  # warm-up
        for arm in arms:
            prefill(n, arm, False)
    for s in range(args.samples):
        order = arms[s % len(arms):] + arms[:s % len(arms)]
        for n in sizes:
            for arm in order:
                wall, cpu, _ = prefill(n, arm, False)
                out[arm, n]["wall"].append(wall)
                out[arm, n]["cpu"].append(cpu)
            for arm in order:
                out[arm, n]["phases"].append(prefill(n, arm, True)[2])
    engine.close()
    med = statistics.median
    activations = next((k for k in ("int8", "bf16", "int16") if getattr(args, f"{k}_activations")), "fp32")
    print(f"{args.model}, {args.quant}, {activations} activations, "
          f"{args.threads} thread(s), {args.samples} samples per arm (prefills alternating); medians, ms")
    for n in sizes:
        print(f"\n{n}-token prompt    " + "".join(f"{arm:>12}" for arm in arms))
        print("  process CPU     " + "".join(f"{med(out[arm, n]['cpu']):12.2f}" for arm in arms))
        print("  wall            " + "".join(f"{med(out[arm, n]['wall']):12.2f}" for arm in arms))
        for i, phase in enumerate(PHASES):
            print(f"  {phase:<16}" + "".join(f"{med([p[i] for p in out[arm, n]['phases']]):12.2f}" for arm in arms))
    print(f"\nload after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
