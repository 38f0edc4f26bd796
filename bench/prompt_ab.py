"""Same-run A/B of the prompt path's GEMM: AMX tiles on and off (``torch.ops.voxlane.set_prefill_amx``)
in one engine, alternating round by round: the TTFT of a 43-token prompt and the prefill rate of a
512-token one (``bench engine --peer llama.cpp``'s prompt rows, through the same ``OurEngine``).

With AMX off the GEMM is the 512-bit FMA path, so for a format that only the AMX path changes the
``fma`` arm is the code before it (with ``--bf16-activations``: the GGUF formats' bf16 tiles against
fp32 activations; with ``--int16-activations``: the R16 matrices' int16 tiles, r16_tiles.h, against
their rows unpacked for the fp32 FMA GEMM). Prints the 1-minute load average before and after.

    python -m bench.prompt_ab [--model smollm2-135m-instruct] [--quant native] [--rounds 5] [--threads 2]
"""
from __future__ import annotations

import argparse
import os
import statistics

from app import model_store
from bench.engine_rows import BenchSettings
from bench.llama_cpp_peer import OurEngine


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--quant", default="native")
    parser.add_argument("--int8-activations", action="store_true")
    parser.add_argument("--bf16-activations", action="store_true",
                        help="EngineConfig.bf16_activations: the amx arm runs the GGUF formats' bf16 tiles")
    parser.add_argument("--int16-activations", action="store_true",
                        help="EngineConfig.int16_activations: the amx arm runs R16's int16 tiles (r16_tiles.h)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ttft-samples", type=int, default=5, help="43-token prompts per round (median)")
    parser.add_argument("--no-stall-fallback", action="store_true",
                        help="always the threads asked for (the step pool's one-thread fallback off, as decode_profile's)")
    args = parser.parse_args(argv)

    from engine import kernels

    ops = kernels.load_kernels()
    if ops is None or not ops.set_prefill_amx(True):
        raise SystemExit("no AMX here (or no kernels): nothing to compare")
    ours = OurEngine(model_store.resolve(args.model, "llm"), args.quant,
                     BenchSettings(tokens=1, runs=args.rounds, batch=1, threads=args.threads),
                     int8_activations=args.int8_activations, bf16_activations=args.bf16_activations,
                     int16_activations=args.int16_activations)
    decoder = getattr(ours.engine.runner, "decoder", None)
    if args.no_stall_fallback and decoder is not None:
        decoder.set_stall_fallback(False)
    print(f"load before: {os.getloadavg()[0]:.2f}")
    arms = {"amx": True, "fma": False}
    ttft: dict[str, list[float]] = {a: [] for a in arms}
    prefill: dict[str, list[float]] = {a: [] for a in arms}
    seed = 1
    for name, on in arms.items():  # warm-up: each arm once
        ops.set_prefill_amx(on)
        ours.ttft_ms(seed)
        ours.prefill_tok_s(seed)
        seed += 1
    for r in range(args.rounds):
        for name, on in (arms.items() if r % 2 == 0 else reversed(arms.items())):
            ops.set_prefill_amx(on)
            samples = []
            for _ in range(args.ttft_samples):
                samples.append(ours.ttft_ms(seed))
                seed += 1
            ttft[name].append(statistics.median(samples))
            prefill[name].append(ours.prefill_tok_s(seed))
            seed += 1
        print(f"round {r + 1}: " + ", ".join(f"{a} TTFT {ttft[a][-1]:.1f} ms prefill {prefill[a][-1]:.0f} tok/s"
                                              for a in arms) + f" (load {os.getloadavg()[0]:.2f})")
    ops.set_prefill_amx(True)
    ours.close()
    for a in arms:
        print(f"{a}: TTFT median {statistics.median(ttft[a]):.1f} ms "
              f"({', '.join(f'{v:.1f}' for v in ttft[a])}); prefill median {statistics.median(prefill[a]):.0f} tok/s "
              f"({', '.join(f'{v:.0f}' for v in prefill[a])})")
    if decoder is not None:
        print(f"steps run on one thread by the stall fallback: {decoder.solo_steps()}")
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
