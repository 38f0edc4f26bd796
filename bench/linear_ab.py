"""One linear with int8 activations, AMX int8 tiles against the vector path: ``python -m bench.linear_ab``.

Multiplies real matrices of the packaged GGUFs (Qwen2.5-0.5B's gate/up (Q5_0), down (Q4_K and Q6_K)
and q (Q5_0); SmolLM2's gate/up and down (Q4_1)) by ``--rows`` activation rows through
``torch.ops.voxlane.quant_linear_q8`` (x quantized to Q8 blocks per call, as in the one-call step's
phases), with AMX on (engine/q8_matmul.h's tiles from 16 rows) and off (its vector path, dot_rows_q8)
alternating round by round in one process; prints the median ms of each and the multiply-adds per
second, and the 1-minute load average before and after. One thread unless ``--threads``.

``--int16``: int16 activations on SmolLM2's R16-packed matrices (engine/r16_tiles.h) instead, through
``quant_linear_r16`` (x quantized per call): AMX int8 tiles reading R16 on 12-bit blocks (``tiles``, the
step's prompt rows: one product per block) and on int16 blocks (``tiles16``: two), against the VNNI kernel
(r16_matmul.h), and the fp32- and bf16-activation products of the same matrix in the file's blocks
(``quant_linear``, ``quant_linear_bf16x``: a prompt chunk's paths without int16), alternating.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.linear_ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", help="activation rows, comma-separated (16,43,512; --int16: 2,8,16,43,512)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--models", default="qwen2.5-0.5b-instruct,smollm2-135m-instruct")
    parser.add_argument("--int16", action="store_true", help="int16 activations on R16 (SmolLM2): tiles vs VNNI, fp32, bf16")
    args = parser.parse_args(argv)
    ops = amx_kernels(args.threads)
    print(f"load before: {os.getloadavg()[0]:.2f}")
    (int16_rows if args.int16 else q8_rows)(args, ops)
    print(f"load after: {os.getloadavg()[0]:.2f}")
    return 0


def amx_kernels(threads: int):
    """The compiled kernels with AMX allowed, torch on ``threads`` threads; exits when there is no AMX."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from engine import kernels

    torch.set_num_threads(threads)
    ops = kernels.load_kernels()
    if ops is None or not ops.set_prefill_amx(True):
        raise SystemExit("no AMX here (or no kernels): nothing to compare")
    return ops


def joined(tensors, names: list[str]):
    """The GGUF tensors ``names`` (one format) as one matrix, their rows stacked (gate/up)."""
    import torch

    from engine.native_weights import QuantWeight

    parts = [tensors.quant(n) for n in names]
    return QuantWeight(parts[0].format, torch.cat([p.blocks for p in parts]).contiguous(), parts[0].cols)


def alternate(arms: dict, x, rounds: int, before=None) -> dict[str, float]:
    """Median ms per call of each arm on ``x``, the arms in turn and in reverse order every other
    round (``before(arm)`` first, then a warm-up call, then the timed calls)."""
    reps = max(1, 20 * 43 // max(len(x), 43))
    ms: dict[str, list[float]] = {a: [] for a in arms}
    for r in range(rounds):
        for arm in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            if before is not None:
                before(arm)
            arms[arm](x)
            start = time.perf_counter()
            for _ in range(reps):
                arms[arm](x)
            ms[arm].append((time.perf_counter() - start) / reps * 1e3)
    return {a: statistics.median(v) for a, v in ms.items()}


def q8_rows(args, ops) -> None:
    """Int8 activations: AMX int8 tiles (from 16 rows) against the vector path, per model and matrix."""
    import torch

    from app import model_store
    from engine import gguf_formats as fmt
    from engine.native_weights import GGUFTensors

    matrices = {"qwen2.5-0.5b-instruct": [("gate/up", ["blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"]),
                                          ("down", ["blk.2.ffn_down.weight"]), ("down", ["blk.0.ffn_down.weight"]),
                                          ("q", ["blk.0.attn_q.weight"])],
                "smollm2-135m-instruct": [("gate/up", ["blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"]),
                                          ("down", ["blk.0.ffn_down.weight"])]}
    rows = [int(r) for r in (args.rows or "16,43,512").split(",")]
    for model in args.models.split(","):
        tensors = GGUFTensors(model_store.gguf_path(model))
        for label, names in matrices[model]:
            w = joined(tensors, names)
            product = lambda x: ops.quant_linear_q8(x, w.blocks, w.format, w.cols, None)  # noqa: E731
            for M in rows:
                med = alternate({"tiles": product, "vector": product}, torch.randn(M, w.cols), args.rounds,
                                before=lambda arm: ops.set_prefill_amx(arm == "tiles"))
                ops.set_prefill_amx(True)
                tiles, vector = med["tiles"], med["vector"]
                gmacs = M * w.rows * w.cols / 1e9
                print(f"{model} {label} {fmt.NAMES[w.format]} {w.rows}x{w.cols}, {M} rows: tiles {tiles:.3f} ms "
                      f"({gmacs / tiles * 1e3:.0f} G/s), vector {vector:.3f} ms ({gmacs / vector * 1e3:.0f} G/s), "
                      f"{vector / tiles:.1f}x", flush=True)


def int16_rows(args, ops) -> None:
    """Int16 activations on SmolLM2's R16-packed matrices: tiles, the VNNI kernel, fp32 and bf16."""
    import torch

    from app import model_store
    from engine import gguf_formats as fmt
    from engine.native_weights import GGUFTensors

    matrices = [("gate/up", ["blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"]), ("down", ["blk.0.ffn_down.weight"]),
                ("q", ["blk.0.attn_q.weight"])]
    rows = [int(r) for r in (args.rows or "2,8,16,43,512").split(",")]
    tensors = GGUFTensors(model_store.gguf_path("smollm2-135m-instruct"))
    for label, names in matrices:
        w = joined(tensors, names)
        packed = w.blocks.clone()
        ops.quant_r16_pack_(packed, w.format, w.cols)
        arms = {"tiles": lambda x: ops.quant_linear_r16(x, packed, w.format, w.cols, 1),
                "tiles16": lambda x: ops.quant_linear_r16(x, packed, w.format, w.cols, 3),
                "vnni": lambda x: ops.quant_linear_r16(x, packed, w.format, w.cols, 0),
                "fp32": lambda x: ops.quant_linear(x, w.blocks, w.format, w.cols, None, None),
                "bf16": lambda x: ops.quant_linear_bf16x(x, w.blocks, w.format, w.cols, None, None)}
        for M in rows:
            med = alternate(arms, torch.randn(M, w.cols), args.rounds)
            gmacs = M * w.rows * w.cols / 1e9
            print(f"smollm2 {label} {fmt.NAMES[w.format]} {w.rows}x{w.cols}, {M} rows: " + ", ".join(
                f"{a} {t:.3f} ms ({gmacs / t * 1e3:.0f} G/s)" for a, t in med.items())
                + f"; tiles vs tiles16 {med['tiles16'] / med['tiles']:.2f}x, vs vnni {med['vnni'] / med['tiles']:.2f}x, vs fp32 {med['fp32'] / med['tiles']:.2f}x, "
                f"vs bf16 {med['bf16'] / med['tiles']:.2f}x", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
