"""How close each weight format's batch-1 kernel is to a plain read of its bytes:
``python -m bench.matrix_pass``.

Streams every matrix a decode step reads (a GGUF's blocks as ``quant="native"`` holds them, huge
pages included) once per pass with one activation row, and once more as a plain read (an int64 sum
of the same bytes: what the memory system gives one core, or ``--threads`` cores reading at once),
and prints per format the MB, the ms per pass and the GB/s of each, medians of ``--rounds``
alternating rounds. The kernels run through ``torch.ops.voxlane.quant_linear_q8`` (int8
activations; the activation row is quantized per call) and ``quant_linear`` (fp32 activations),
split over ``--threads`` torch threads in tasks of 16 rows, as the one-call step splits them.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.matrix_pass", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-0.5b-instruct")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-fp32", action="store_true", help="skip the fp32-activation kernels")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from app.model_store import resolve
    from engine import gguf_formats as fmt
    from engine.kernels import load_kernels
    from engine.native_weights import GGUFTensors, native_gguf_path

    torch.set_num_threads(args.threads)
    ops = load_kernels()
    if ops is None:
        raise SystemExit("the kernels did not build")
    tensors = GGUFTensors(native_gguf_path(resolve(args.model, "llm")))
    tied = "output.weight" not in tensors
    names = [n for n, t in tensors.tensors.items() if len(t.shape) == 2 and (n != "token_embd.weight" or tied)]
    weights = {name: tensors.quant(name) for name in names}  # copied into the huge-page arena
    xs = {cols: torch.randn(1, cols) for cols in {w.cols for w in weights.values()}}
    by_format: dict[str, list] = defaultdict(list)
    for w in weights.values():
        by_format[fmt.NAMES[w.format]].append(w)

    def plain(ws) -> None:
        for w in ws:
            w.blocks.view(-1)[: w.blocks.numel() // 8 * 8].view(torch.int64).sum()

    def q8(ws) -> None:
        for w in ws:
            ops.quant_linear_q8(xs[w.cols], w.blocks, w.format, w.cols, None)

    def f32(ws) -> None:
        for w in ws:
            ops.quant_linear(xs[w.cols], w.blocks, w.format, w.cols, None, None)

    kinds = {"plain read": plain, "int8 act.": q8, **({} if args.no_fp32 else {"fp32 act.": f32})}
    times: dict[tuple[str, str], list[float]] = defaultdict(list)
    for kind, run in kinds.items():  # warm-up
        for ws in by_format.values():
            run(ws)
    for _ in range(args.rounds):
        for fmt_name, ws in by_format.items():
            for kind, run in kinds.items():
                start = time.perf_counter()
                run(ws)
                times[fmt_name, kind].append(time.perf_counter() - start)
    print(f"{args.model}: one pass over the {len(weights)} matrices of a decode step, batch 1, {args.threads} "
          f"thread(s), median of {args.rounds} alternating rounds, 1-min load {os.getloadavg()[0]:.2f} at the end")
    total: dict[str, float] = defaultdict(float)
    for fmt_name, ws in by_format.items():
        mb = sum(w.blocks.numel() for w in ws) / 1e6
        cells = []
        for kind in kinds:
            ms = statistics.median(times[fmt_name, kind]) * 1e3
            total[kind] += ms
            cells.append(f"{kind} {ms:7.2f} ms {mb / ms:5.1f} GB/s")
        print(f"  {fmt_name:5s} {len(ws):4d} matrices {mb:7.1f} MB   " + "   ".join(cells))
    mb = sum(w.blocks.numel() for w in weights.values()) / 1e6
    print(f"  all   {len(weights):4d} matrices {mb:7.1f} MB   "
          + "   ".join(f"{kind} {ms:7.2f} ms {mb / ms:5.1f} GB/s" for kind, ms in total.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
