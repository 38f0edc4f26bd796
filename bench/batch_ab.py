"""The batch-8 row of ``voxlane bench engine`` (engine_rows: 8 chat prompts submitted at once, 128 greedy
tokens each, tokens / wall) in one engine, with its wall split per engine step: ``python -m bench.batch_ab``.

Per run it prints the aggregate and where the wall went: the prompt steps (how many rows, in how many
chunks, mixed with decode rows or not), the decode steps (their count and median time in the native call)
and the rest of each step (Python: plan, sampling, outputs; wall time, so under load it holds waits for the
CPU too), and the run's CPU time (every thread's: under load, what an A/B of the work itself reads; with
two threads it holds the step pool's spinning too). ``--ab-batch-tiles`` alternates the decoding batches' AMX tiles (engine/r16_batch.h) with the
VNNI kernel run by run (order reversed every other round) and prints the medians; ``--no-stall-fallback``
keeps every step on the threads asked for (each run prints its steps on one thread either way); ``--json`` prints one
JSON object with every run's split instead. ``--temperature 0.6 --top-p 0.9 --repetition-penalty 1.1
--dry-multiplier 0.8`` samples as the nova persona does (the step's logits and the sampler, not the
greedy step's argmax).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from types import SimpleNamespace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batch_ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.0, help="sample instead of greedy (a persona: 0.7)")
    parser.add_argument("--top-p", type=float, default=1.0, help="with --temperature (a persona: 0.9)")
    parser.add_argument("--repetition-penalty", type=float, default=1.0, help="a persona's (nova: 1.1)")
    parser.add_argument("--dry-multiplier", type=float, default=0.0, help="a persona's DRY (nova: 0.8)")
    parser.add_argument("--ab-batch-tiles", action="store_true", help="alternate the batch tiles and the VNNI kernel")
    parser.add_argument("--no-stall-fallback", action="store_true",
                        help="always the threads asked for (the step pool's one-thread fallback off)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the lines")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from app.model_store import resolve
    from bench.engine_rows import batch_prompts
    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from engine.sampling_params import SamplingParams

    config = EngineConfig(dtype="float32", quant="native", max_batch_size=args.batch, num_slots=args.batch,
                          max_seq_len=1024, admission_window_ms=0, prefill_chunk_tokens=512,
                          num_threads=args.threads, int16_activations=True)  # as engine_rows with --int16-activations
    engine = LLMEngine(resolve(args.model, "llm"), config)
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.tokens,
                              repetition_penalty=args.repetition_penalty, dry_multiplier=args.dry_multiplier)
    steps: list[dict] = []
    runner, decoder = engine.runner, engine.runner.decoder
    if args.no_stall_fallback:
        decoder.set_stall_fallback(False)

    def timed(native_call):  # the native call, its time added to the step's
        def call(*args):
            start = time.perf_counter()
            out = native_call(*args)
            steps[-1]["native"] += time.perf_counter() - start
            return out

        return call

    run_plan, engine_step = runner.run, engine.step

    def run(plan):
        steps.append({"prompt_rows": sum(e - s for _, s, e in plan.prefills), "chunks": len(plan.prefills),
                      "decode_rows": len(plan.decode), "native": 0.0})
        return run_plan(plan)

    def step():
        start = time.perf_counter()
        did = engine_step()
        if steps and "wall" not in steps[-1]:
            steps[-1]["wall"] = time.perf_counter() - start
        return did

    runner.decoder, runner.run, engine.step = SimpleNamespace(step=timed(decoder.step)), run, step
    step_calls = runner.step_calls  # the native call through ctypes (StepCalls): greedy and sampled steps
    if step_calls is not None:
        runner.step_calls = SimpleNamespace(step=timed(step_calls.step), rows=timed(step_calls.rows),
                                            logits=timed(step_calls.logits), expect_step=step_calls.expect_step)

    cpu = [0.0]  # the last run's CPU seconds, every thread of the process (the engine's and the pool's)
    solo = [0]  # the last run's steps on one thread (the step pool's stall fallback)

    def batch_run() -> float:
        steps.clear()
        start, cpu_start, solo_start = time.perf_counter(), time.process_time(), decoder.solo_steps()
        streams = [engine.submit(p, sampling, ignore_eos=True) for p in batch_prompts(args.batch)]
        for s in streams:
            s.text()
        cpu[0] = time.process_time() - cpu_start
        solo[0] = decoder.solo_steps() - solo_start
        # The streams end inside the last step (its outputs), before its wall is stamped: wait for the stamp.
        deadline = time.perf_counter() + 5.0
        while steps and "wall" not in steps[-1] and time.perf_counter() < deadline:
            time.sleep(0.001)
        return sum(len(s.output_ids) for s in streams) / (max(s.finished_at for s in streams) - start)

    def split(arm: str, round_: int, aggregate: float) -> dict:
        """One run's wall per kind of step (ms)."""
        prompt = [s for s in steps if s["prompt_rows"]]
        decode = [s for s in steps if not s["prompt_rows"]]
        total = sum(s.get("wall", 0.0) for s in steps)
        return {"arm": arm, "round": round_, "tok_s": aggregate, "cpu_ms": cpu[0] * 1e3, "solo_steps": solo[0],
                "prompt_steps": [{"rows": s["prompt_rows"], "chunks": s["chunks"], "decode_rows": s["decode_rows"],
                                  "native_ms": s["native"] * 1e3} for s in prompt],
                "decode_steps": len(decode),
                "decode_native_median_ms": statistics.median(s["native"] for s in decode) * 1e3 if decode else 0.0,
                "decode_native_ms": sum(s["native"] for s in decode) * 1e3,
                "rest_ms": (total - sum(s["native"] for s in steps)) * 1e3, "wall_ms": total * 1e3}

    def report(run: dict) -> None:
        print(f"  round {run['round']} {run['arm']}: {run['tok_s']:.1f} tok/s; {len(run['prompt_steps'])} prompt step(s) "
              + ", ".join(f"{s['rows']} rows in {s['chunks']} chunks + {s['decode_rows']} decode rows "
                          f"{s['native_ms']:.0f} ms" for s in run["prompt_steps"])
              + f"; {run['decode_steps']} decode steps, native median {run['decode_native_median_ms']:.2f} ms "
              f"(sum {run['decode_native_ms']:.0f}); the rest of the steps {run['rest_ms']:.0f} ms of "
              f"{run['wall_ms']:.0f}; {run['cpu_ms']:.0f} ms CPU; {run['solo_steps']} steps on one thread", flush=True)

    ops = torch.ops.voxlane
    arms = ("tiles", "vnni") if args.ab_batch_tiles else ("as built",)
    if args.ab_batch_tiles and not ops.set_r16_batch_tiles(True):
        raise SystemExit("the batch tiles do not run here (no AMX int8)")
    load_start = os.getloadavg()[0]
    if not args.json:
        print(f"{args.model}, native + int16, batch {args.batch}, {args.tokens} tokens, {args.threads} threads, "
              f"temperature {args.temperature}, top_p {args.top_p}, repetition penalty {args.repetition_penalty}, "
              f"DRY {args.dry_multiplier}, 1-min load {load_start:.1f}")
    runs: list[dict] = []
    try:
        batch_run()  # warm-up
        for r in range(args.rounds):
            for arm in (arms if r % 2 == 0 else arms[::-1]):
                if args.ab_batch_tiles:
                    ops.set_r16_batch_tiles(arm == "tiles")
                runs.append(split(arm, r + 1, batch_run()))
                if not args.json:
                    report(runs[-1])
    finally:
        if args.ab_batch_tiles:
            ops.set_r16_batch_tiles(True)
        engine.close()
    medians = {a: statistics.median(run["tok_s"] for run in runs if run["arm"] == a) for a in arms}
    if args.json:
        print(json.dumps({"model": args.model, "batch": args.batch, "tokens": args.tokens, "threads": args.threads,
                          "temperature": args.temperature, "top_p": args.top_p,
                          "load_average": [load_start, os.getloadavg()[0]], "runs": runs,
                          "median_tok_s": medians}, indent=2))
    else:
        print(f"medians (1-min load {os.getloadavg()[0]:.1f}): "
              + ", ".join(f"{a} {v:.1f} tok/s" for a, v in medians.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
