"""Where the milliseconds of one decode step go: ``python -m bench.decode_profile``.

Runs ``--steps`` decode steps of ``--batch`` sequences (after a short prefill) through the engine's
runner and prints the wall time per step and, for the one native call, the CPU time per phase kind
summed over threads (``NativeDecoder.set_profiling``); ``--torch-profiler`` prints torch's operator
table instead (what a step of the per-op paths spends, and how many ATen calls it makes).
``--ab-int8-activations`` instead alternates fp32 and int8 activations on the same native decoder,
round by round: decode ms per step and a ``--prefill-tokens`` prefill, medians and ratios.
``--ab-batch-tiles`` alternates the decoding batches' AMX tiles (engine/r16_batch.h) with the VNNI kernel
(r16_matmul.h) round by round (int16 activations): ms per step and CPU per phase, medians of the rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

PHASES = ("input norm", "qkv", "k/v write", "attention", "o_proj", "post norm", "gate/up + SiLU", "down",
          "final norm", "LM head")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.decode_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--quant", default="native", help="none | int8 | native")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--torch-profiler", action="store_true", help="torch's operator table of the steps")
    parser.add_argument("--int8-activations", action="store_true", help="EngineConfig.int8_activations (native)")
    parser.add_argument("--bf16-activations", action="store_true", help="EngineConfig.bf16_activations (native)")
    parser.add_argument("--int16-activations", action="store_true", help="EngineConfig.int16_activations (native)")
    parser.add_argument("--kv-cache-dtype", default="auto", help="EngineConfig.kv_cache_dtype: auto | float32 | float16")
    parser.add_argument("--ab-int8-activations", action="store_true",
                        help="alternate fp32 / int8 activations on one decoder (quant native), --rounds rounds")
    parser.add_argument("--ab-batch-tiles", action="store_true",
                        help="alternate the batch tiles and the VNNI kernel in decoding batches (--int16-activations)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prefill-tokens", type=int, default=128)
    parser.add_argument("--no-phase-profile", action="store_true",
                        help="no per-phase CPU times (each task's clock reads cost ~1 %% of a step)")
    parser.add_argument("--no-stall-fallback", action="store_true",
                        help="always the threads asked for (the step pool's one-thread fallback off)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from app.model_store import resolve
    from engine.config import EngineConfig
    from engine.engine import LLMEngine

    torch.set_num_threads(args.threads)
    engine = LLMEngine(resolve(args.model, "llm"), EngineConfig(quant=args.quant, max_seq_len=512,
                                                                 num_slots=max(args.batch, 1) + 1,
                                                                 max_batch_size=max(args.batch, 1),
                                                                 num_threads=args.threads,
                                                                 int8_activations=args.int8_activations,
                                                                 bf16_activations=args.bf16_activations,
                                                                 int16_activations=args.int16_activations,
                                                                 kv_cache_dtype=args.kv_cache_dtype),
                            background=False)
    runner = engine.runner
    slots = list(range(args.batch))
    for slot in slots:
        runner.prefill(slot, [100 + 7 * slot + i for i in range(40)], 0, want_logits=False)

    cpu_ms: list[float] = []  # each steps() call's CPU ms per step, all threads (process time)

    def steps(n: int) -> float:
        start, cpu = time.perf_counter(), time.process_time()
        for i in range(n):
            runner.decode(slots, [200 + i] * len(slots), [40 + i] * len(slots))
        cpu_ms.append((time.process_time() - cpu) / n * 1e3)
        return (time.perf_counter() - start) / n * 1e3

    decoder = getattr(runner, "decoder", None)
    if decoder is not None and args.no_stall_fallback:
        decoder.set_stall_fallback(False)
    steps(4)  # warm-up
    if args.ab_int8_activations:
        return ab_int8_activations(args, engine, steps)
    if args.ab_batch_tiles:
        return ab_batch_tiles(args, engine, steps)
    result: dict = {"quant": args.quant, "int8_activations": args.int8_activations,
                    "int16_activations": args.int16_activations, "kv_cache": str(engine.kv_cache.tensors.k.dtype),
                    "batch": args.batch, "threads": args.threads, "load_avg": os.getloadavg()[0]}
    if args.torch_profiler:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            result["ms_per_step"] = steps(args.steps)
        events = prof.key_averages()
        result["aten_calls_per_step"] = sum(e.count for e in events if e.key.startswith("aten::")) / args.steps
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
    else:
        if decoder is not None and not args.no_phase_profile:
            decoder.set_profiling(True)
        result["ms_per_step"] = steps(args.steps)
        if decoder is not None:
            result["solo_steps"] = decoder.solo_steps()  # steps on one thread: helpers stalled (load)
        if decoder is not None and not args.no_phase_profile:
            result["cpu_ms_per_step_by_phase"] = {name: ms / args.steps for name, ms in
                                                  zip(PHASES, decoder.profile_ms())}
            result["handoffs"] = handoffs(decoder.handoff_profile(), args.steps, args.threads)
            decoder.set_profiling(False)
        table = ""
    # The process's CPU time per step (every thread's; the helpers' spinning between steps too): under
    # load, where the wall time holds waits for a core, this is what an A/B of the step's own work reads.
    result["cpu_ms_per_step"] = cpu_ms[-1]
    engine.close()
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.quant}{', int8 activations' if args.int8_activations else ''}"
          f"{', int16 activations' if args.int16_activations else ''}, batch {args.batch}, {args.threads} threads: {result['ms_per_step']:.2f} ms per step "
          f"(wall), {result['cpu_ms_per_step']:.2f} ms CPU, 1-min load average {result['load_avg']:.1f}"
          + (f", {result['solo_steps']} steps on one thread (helpers stalled)" if "solo_steps" in result else ""))
    if "aten_calls_per_step" in result:
        print(f"ATen calls per step: {result['aten_calls_per_step']:.0f}\n{table}")
    for name, ms in result.get("cpu_ms_per_step_by_phase", {}).items():
        print(f"  {name:16s} {ms:7.3f} ms CPU per step")
    if "handoffs" in result:
        h = result["handoffs"]
        print(f"  per step: {result['ms_per_step'] - h['step_ms']:.3f} ms outside the native call (Python), "
              f"{h['step_ms']:.3f} ms in the native call, {h['pool_ms']:.3f} in the pool, "
              f"{h['tail_ms']:.3f} waiting for the last tasks after the calling thread's last "
              f"({h['pool_steps']} of {args.steps} steps in the pool's figures)")
        for w, row in enumerate(h["workers"]):
            print(f"  worker {w}: tasks {row['task_ms']:.3f} ms, waiting for the phase before {row['wait_ms']:.3f} ms "
                  f"({row['waits']:.1f} waits), tickets and counters {row['other_ms']:.3f} ms; "
                  f"{row['tasks']:.1f} tasks per step"
                  + (f"; joined {row['join_ms']:.3f} ms after the step's start, asleep before {row['sleeps']:.2f} of the steps"
                     if w else ""))
    return 0


def handoffs(profile: list[int], steps: int, threads: int) -> dict:
    """``NativeDecoder.handoff_profile()`` per step: ms in the native call and in the step pool, and per
    worker (0 = the calling thread) ms in tasks, waiting for the phase before, and taking tickets."""
    step_ns, pool_steps, run_ns, tail_ns, rest = profile[0], profile[1], profile[2], profile[3], profile[4:]
    per = max(pool_steps, 1)
    workers = []
    for w in range(min(threads, len(rest) // 7)):
        task_ns, wait_ns, other_ns, tasks, waits, join_ns, sleeps = rest[7 * w:7 * w + 7]
        workers.append({"task_ms": task_ns / per / 1e6, "wait_ms": wait_ns / per / 1e6, "other_ms": other_ns / per / 1e6,
                        "tasks": tasks / per, "waits": waits / per, "join_ms": join_ns / per / 1e6,
                        "sleeps": sleeps / per})
    return {"step_ms": step_ns / steps / 1e6, "pool_ms": run_ns / per / 1e6, "tail_ms": tail_ns / per / 1e6,
            "pool_steps": pool_steps, "workers": workers}


def ab_int8_activations(args, engine, steps) -> int:
    """fp32 vs int8 activations, alternating round by round on the same decoder and cache."""
    import statistics

    runner, decoder = engine.runner, engine.runner.decoder
    if decoder is None or args.quant != "native":
        raise SystemExit("--ab-int8-activations needs --quant native and the kernels")
    prompt = [300 + (7 * i) % 5000 for i in range(args.prefill_tokens)]

    def prefill_ms() -> float:
        start = time.perf_counter()
        runner.prefill(args.batch, prompt, 0)  # the spare slot, overwritten each round
        return (time.perf_counter() - start) * 1e3

    figures: dict[str, dict[str, list[float]]] = {mode: {"decode_ms": [], "prefill_ms": []} for mode in ("fp32", "int8")}
    for _ in range(args.rounds):
        for mode in ("fp32", "int8"):
            decoder.set_int8_activations(mode == "int8")
            figures[mode]["decode_ms"].append(steps(args.steps))
            figures[mode]["prefill_ms"].append(prefill_ms())
    engine.close()
    medians = {mode: {k: statistics.median(v) for k, v in f.items()} for mode, f in figures.items()}
    result = {"batch": args.batch, "threads": args.threads, "rounds": args.rounds, "load_avg": os.getloadavg()[0],
              "median": medians, "int8_vs_fp32_time": {k: medians["int8"][k] / medians["fp32"][k]
                                                        for k in ("decode_ms", "prefill_ms")}}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.model}, native, batch {args.batch}, {args.threads} threads, {args.rounds} alternating rounds, "
          f"1-min load average {result['load_avg']:.1f} (at the end)")
    for key, label in (("decode_ms", "ms per decode step"), ("prefill_ms", f"ms per {args.prefill_tokens}-token prefill")):
        print(f"  {label:28s} fp32 {medians['fp32'][key]:8.2f}  int8 {medians['int8'][key]:8.2f}  "
              f"int8/fp32 {result['int8_vs_fp32_time'][key]:.2f}")
    return 0


def ab_batch_tiles(args, engine, steps) -> int:
    """Decoding batches in the batch tiles vs the VNNI kernel, alternating round by round (order
    reversed every other round) on the same decoder and cache: ms per step and CPU per phase."""
    import statistics

    import torch

    decoder = engine.runner.decoder
    if decoder is None or not args.int16_activations:
        raise SystemExit("--ab-batch-tiles needs --int16-activations and the kernels")
    ops = torch.ops.voxlane
    if not ops.set_r16_batch_tiles(True):
        raise SystemExit("the batch tiles do not run here (no AMX int8)")
    load = [os.getloadavg()[0]]
    arms = ("tiles", "vnni")
    ms: dict[str, list[float]] = {a: [] for a in arms}
    phases: dict[str, list[list[float]]] = {a: [] for a in arms}
    for r in range(args.rounds):
        for arm in (arms if r % 2 == 0 else arms[::-1]):
            ops.set_r16_batch_tiles(arm == "tiles")
            steps(2)
            decoder.set_profiling(True)
            ms[arm].append(steps(args.steps))
            phases[arm].append([v / args.steps for v in decoder.profile_ms()])
            decoder.set_profiling(False)
    ops.set_r16_batch_tiles(True)
    load.append(os.getloadavg()[0])
    engine.close()
    print(f"{args.model}, native + int16, batch {args.batch}, {args.threads} threads, {args.rounds} alternating rounds "
          f"of {args.steps} steps, 1-min load {load[0]:.1f} -> {load[1]:.1f}")
    med = {a: statistics.median(ms[a]) for a in arms}
    print(f"  ms per step (wall)  tiles {med['tiles']:7.2f}  vnni {med['vnni']:7.2f}  tiles/vnni {med['tiles'] / med['vnni']:.2f}"
          f"   (tiles {', '.join(f'{v:.2f}' for v in ms['tiles'])}; vnni {', '.join(f'{v:.2f}' for v in ms['vnni'])})")
    for i, name in enumerate(PHASES):
        t, v = (statistics.median(p[i] for p in phases[a]) for a in arms)
        print(f"  {name:16s} tiles {t:7.3f}  vnni {v:7.3f} ms CPU per step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
