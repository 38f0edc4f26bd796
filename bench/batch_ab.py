"""The batch-8 row of ``voxlane bench engine`` (engine_rows: 8 chat prompts submitted at once, 128 greedy
tokens each, tokens / wall) in one engine, with its wall split per engine step: ``python -m bench.batch_ab``.

Per run it prints the aggregate and where the wall went: the prompt steps (how many rows, in how many
chunks, mixed with decode rows or not), the decode steps (their count and median time in the native call)
and the rest of each step (Python: plan, sampling, outputs; wall time, so under load it holds waits for the
CPU too). ``--ab-batch-tiles`` alternates the decoding batches' AMX tiles (engine/r16_batch.h) with the
VNNI kernel run by run (order reversed every other round) and prints the medians.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batch_ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ab-batch-tiles", action="store_true", help="alternate the batch tiles and the VNNI kernel")
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
    greedy = SamplingParams(temperature=0.0, max_tokens=args.tokens)
    steps: list[dict] = []
    runner, decoder = engine.runner, engine.runner.decoder

    class Timed:  # the native call, timed
        def step(self, *call):
            start = time.perf_counter()
            logits = decoder.step(*call)
            steps[-1]["native"] += time.perf_counter() - start
            return logits

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

    runner.decoder, runner.run, engine.step = Timed(), run, step

    def batch_run() -> float:
        steps.clear()
        start = time.perf_counter()
        streams = [engine.submit(p, greedy, ignore_eos=True) for p in batch_prompts(args.batch)]
        for s in streams:
            s.text()
        return sum(len(s.output_ids) for s in streams) / (max(s.finished_at for s in streams) - start)

    def report(label: str, aggregate: float) -> None:
        prompt = [s for s in steps if s["prompt_rows"]]
        decode = [s for s in steps if not s["prompt_rows"]]
        total = sum(s.get("wall", 0.0) for s in steps)
        print(f"  {label}: {aggregate:.1f} tok/s; {len(prompt)} prompt step(s) "
              + ", ".join(f"{s['prompt_rows']} rows in {s['chunks']} chunks + {s['decode_rows']} decode rows "
                          f"{s['native'] * 1e3:.0f} ms" for s in prompt)
              + f"; {len(decode)} decode steps, native median {statistics.median(s['native'] for s in decode) * 1e3:.2f} ms "
              f"(sum {sum(s['native'] for s in decode) * 1e3:.0f}); the rest of the steps "
              f"{(total - sum(s['native'] for s in steps)) * 1e3:.0f} ms of {total * 1e3:.0f}", flush=True)

    ops = torch.ops.voxlane
    arms = ("tiles", "vnni") if args.ab_batch_tiles else ("as built",)
    if args.ab_batch_tiles and not ops.set_r16_batch_tiles(True):
        raise SystemExit("the batch tiles do not run here (no AMX int8)")
    print(f"{args.model}, native + int16, batch {args.batch}, {args.tokens} tokens, {args.threads} threads, "
          f"1-min load {os.getloadavg()[0]:.1f}")
    try:
        batch_run()  # warm-up
        figures: dict[str, list[float]] = {a: [] for a in arms}
        for r in range(args.rounds):
            for arm in (arms if r % 2 == 0 else arms[::-1]):
                if args.ab_batch_tiles:
                    ops.set_r16_batch_tiles(arm == "tiles")
                figures[arm].append(batch_run())
                report(f"round {r + 1} {arm}", figures[arm][-1])
    finally:
        if args.ab_batch_tiles:
            ops.set_r16_batch_tiles(True)
        engine.close()
    print(f"medians (1-min load {os.getloadavg()[0]:.1f}): "
          + ", ".join(f"{a} {statistics.median(v):.1f} tok/s" for a, v in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
