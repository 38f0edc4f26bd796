"""One linear with int8 activations, AMX int8 tiles against the vector path: ``python -m bench.linear_ab``.

Multiplies real matrices of the packaged GGUFs (Qwen2.5-0.5B's gate/up (Q5_0), down (Q4_K and Q6_K)
and q (Q5_0); SmolLM2's gate/up and down (Q4_1)) by ``--rows`` activation rows through
``torch.ops.voxlane.quant_linear_q8`` (x quantized to Q8 blocks per call, as in the one-call step's
phases), with AMX on (engine/q8_matmul.h's tiles from 16 rows) and off (its vector path, dot_rows_q8)
alternating round by round in one process; prints the median ms of each and the multiply-adds per
second, and the 1-minute load average before and after. One thread unless ``--threads``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.linear_ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="16,43,512", help="activation rows, comma-separated")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--models", default="qwen2.5-0.5b-instruct,smollm2-135m-instruct")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from app import model_store
    from engine import gguf_formats as fmt
    from engine import kernels
    from engine.native_weights import GGUFTensors, QuantWeight

    torch.set_num_threads(args.threads)
    ops = kernels.load_kernels()
    if ops is None or not ops.set_prefill_amx(True):
        raise SystemExit("no AMX here (or no kernels): nothing to compare")
    matrices = {"qwen2.5-0.5b-instruct": [("gate/up", ["blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"]),
                                          ("down", ["blk.2.ffn_down.weight"]), ("down", ["blk.0.ffn_down.weight"]),
                                          ("q", ["blk.0.attn_q.weight"])],
                "smollm2-135m-instruct": [("gate/up", ["blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"]),
                                          ("down", ["blk.0.ffn_down.weight"])]}
    rows = [int(r) for r in args.rows.split(",")]
    print(f"load before: {os.getloadavg()[0]:.2f}")
    for model in args.models.split(","):
        tensors = GGUFTensors(model_store.gguf_path(model))
        for label, names in matrices[model]:
            parts = [tensors.quant(n) for n in names]
            w = QuantWeight(parts[0].format, torch.cat([p.blocks for p in parts]).contiguous(), parts[0].cols)
            for M in rows:
                x = torch.randn(M, w.cols)
                reps = max(1, 20 * 43 // max(M, 43))
                ms: dict[bool, list[float]] = {True: [], False: []}
                for r in range(args.rounds):
                    for amx in ((True, False) if r % 2 == 0 else (False, True)):
                        ops.set_prefill_amx(amx)
                        ops.quant_linear_q8(x, w.blocks, w.format, w.cols, None)
                        start = time.perf_counter()
                        for _ in range(reps):
                            ops.quant_linear_q8(x, w.blocks, w.format, w.cols, None)
                        ms[amx].append((time.perf_counter() - start) / reps * 1e3)
                ops.set_prefill_amx(True)
                tiles, vector = statistics.median(ms[True]), statistics.median(ms[False])
                gmacs = M * w.rows * w.cols / 1e9
                print(f"{model} {label} {fmt.NAMES[w.format]} {w.rows}x{w.cols}, {M} rows: tiles {tiles:.3f} ms "
                      f"({gmacs / tiles * 1e3:.0f} G/s), vector {vector:.3f} ms ({gmacs / vector * 1e3:.0f} G/s), "
                      f"{vector / tiles:.1f}x", flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
