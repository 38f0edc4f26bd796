"""``voxlane bench engine --peer llama.cpp``: our engine and a natively built llama.cpp on the same
GGUF file, measured in one run, alternating (ours, then theirs, ``runs`` times), so both see the
same machine: on a shared VM the speed moves by the minute, and only ratios taken side by side mean
something.

llama.cpp is built on demand by ``bench.llama_cpp_build`` (never a Voxlane dependency) and run
through its own tools, as its users measure it: ``llama-bench`` (decode ``-p 0 -n N``, prompt
processing ``-p P -n 0``; 2 threads, flash attention) and ``llama-batched-bench`` (N sequences of a
43-token prompt, all prompts then all decodes, wall time of the whole run).

Figures, ours and theirs:
  decode tok/s       batch 1, one new token per step (ours: after the first token of a 128-token
                     greedy answer; theirs: llama-bench tg)
  TTFT ms            a 43-token prompt to its first token (theirs: 43 / pp43 rate)
  prefill tok/s      a ~512-token prompt (theirs: pp512)
  batch aggregate    ``batch`` prompts of ~43 tokens answered together, generated tokens / wall
                     time, the prefills included (theirs: llama-batched-bench)
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from bench.llama_cpp_build import build_peer as build_llama_cpp

TTFT_PROMPT = 43  # tokens: the issue's TTFT prompt
PREFILL_PROMPT = 512


def peer_env() -> dict[str, str]:
    """The environment for llama.cpp's tools: ours without the OpenMP settings. ggml's CPU backend
    is an OpenMP team, and the OMP_WAIT_POLICY=PASSIVE / OMP_NUM_THREADS=1 that our runs and tests
    export for torch put its threads to sleep at each of a step's barriers: llama-bench -t 2 on
    SmolLM2 ran 153-157 tok/s with them and 300-306 without (2026-12-01 18:23, quiet). Its
    threads are set by -t; everything else is its own defaults, as its users run it."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "KMP_"))}


def llama_bench(tools: Path, gguf: Path, threads: int, prompt: int, gen: int) -> float:
    """One llama-bench run (-r 1) -> tokens per second of its one test."""
    cmd = [str(tools / "llama-bench"), "-m", str(gguf), "-p", str(prompt), "-n", str(gen), "-t", str(threads),
           "-fa", "1", "-r", "1", "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=True, env=peer_env())
    return float(json.loads(out.stdout)[0]["avg_ts"])


def llama_batched(tools: Path, gguf: Path, threads: int, prompt: int, gen: int, batch: int) -> float:
    """llama-batched-bench, ``batch`` sequences -> generated tokens per second over the whole run."""
    cmd = [str(tools / "llama-batched-bench"), "-m", str(gguf), "-c", str(batch * (prompt + gen) + 64),
           "-b", "2048", "-ub", "512", "-npp", str(prompt), "-ntg", str(gen), "-npl", str(batch),
           "-t", str(threads), "-fa", "on", "--output-format", "jsonl"]
    for attempt in range(2):  # once (13:41, load 5) it exited 0 with no result line: one retry, then no figure
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=True, env=peer_env())
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        if lines:
            return batch * gen / float(json.loads(lines[0])["t"])
    raise subprocess.CalledProcessError(out.returncode, cmd, out.stdout,
                                        out.stderr + "\nno result line in its output, twice")


class OurEngine:
    """Our engine on the same GGUF (``quant``), measured one figure at a time."""

    def __init__(self, model_dir: Path, quant: str, settings, int8_activations: bool = False,
                 bf16_activations: bool = False, int16_activations: bool = False):
        from engine.config import EngineConfig
        from engine.engine import LLMEngine

        self.settings = settings
        self.engine = LLMEngine(model_dir, EngineConfig(quant=quant, max_batch_size=max(settings.batch, 1),
                                                        num_slots=max(settings.batch, 1), max_seq_len=1024,
                                                        admission_window_ms=0, prefill_chunk_tokens=1024,
                                                        num_threads=settings.threads,
                                                        int8_activations=int8_activations,
                                                        bf16_activations=bf16_activations,
                                                        int16_activations=int16_activations))
        self.vocab = len(self.engine.tokenizer)

    def _ids(self, n: int, seed: int) -> list[int]:
        """n token ids of ordinary text (a fresh prompt per call: nothing cached to reuse)."""
        text = " ".join(f"lighthouse{seed} keeper {i} walked along the shore" for i in range(n))
        return self.engine.tokenizer.encode(text, add_special_tokens=False)[:n]

    def _run(self, ids: list[int], tokens: int):
        from engine.sampling_params import SamplingParams

        stream = self.engine.submit(ids, SamplingParams(temperature=0.0, max_tokens=tokens), ignore_eos=True)
        stream.text()
        return stream

    def decode_tok_s(self, seed: int) -> float:
        stream = self._run(self._ids(TTFT_PROMPT, seed), self.settings.tokens)
        return (len(stream.output_ids) - 1) / (stream.finished_at - stream.first_token_at)

    def ttft_ms(self, seed: int) -> float:
        return self._run(self._ids(TTFT_PROMPT, seed), 1).ttft_s * 1e3

    def prefill_tok_s(self, seed: int) -> float:
        stream = self._run(self._ids(PREFILL_PROMPT, seed), 1)
        return stream.prompt_tokens / stream.ttft_s

    def batch_tok_s(self, seed: int) -> float:
        from engine.sampling_params import SamplingParams

        greedy = SamplingParams(temperature=0.0, max_tokens=self.settings.tokens)
        start = time.perf_counter()
        streams = [self.engine.submit(self._ids(TTFT_PROMPT, seed * 100 + i), greedy, ignore_eos=True)
                   for i in range(self.settings.batch)]
        for stream in streams:
            stream.text()
        return sum(len(s.output_ids) for s in streams) / (max(s.finished_at for s in streams) - start)

    def close(self) -> None:
        self.engine.close()


def failure(error: subprocess.CalledProcessError) -> str:
    """Why a llama.cpp tool gave no figure: its signal or exit code, and its last words."""
    code = error.returncode
    how = f"died of signal {-code}" if code < 0 else f"exited with {code}"
    last = (error.stderr or "").strip().splitlines()[-1:] or [""]
    return f"{Path(error.cmd[0]).name} {how}" + (f": {last[0][:200]}" if last[0] else "")


def _median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def compare(model_dir: Path, gguf: Path, settings, quant: str = "native", log=None,
            int8_activations: bool = False, bf16_activations: bool = False, int16_activations: bool = False) -> dict:
    """Ours and llama.cpp's figures on ``gguf``, alternating within each round, median over
    ``settings.runs`` rounds after a warm-up -> {"ours": {...}, "llama.cpp": {...}, "ratios": {...},
    "load_avg": [at start, at end]}."""
    tools, variant = build_llama_cpp(smoke_gguf=gguf)  # the first build that runs a prompt here
    ours = OurEngine(model_dir, quant, settings, int8_activations, bf16_activations, int16_activations)
    t, n, b = settings.threads, settings.tokens, settings.batch
    measures = {  # name -> (ours, theirs)
        "decode_tok_s": (ours.decode_tok_s, lambda seed: llama_bench(tools, gguf, t, 0, n)),
        "ttft_ms": (ours.ttft_ms, lambda seed: TTFT_PROMPT / llama_bench(tools, gguf, t, TTFT_PROMPT, 0) * 1e3),
        "prefill_tok_s": (ours.prefill_tok_s, lambda seed: llama_bench(tools, gguf, t, PREFILL_PROMPT, 0)),
        f"batch{b}_tok_s": (ours.batch_tok_s, lambda seed: llama_batched(tools, gguf, t, TTFT_PROMPT, n, b)),
    }
    figures: dict[str, dict[str, list[float]]] = {"ours": {}, "llama.cpp": {}}
    errors: dict[str, str] = {}  # a row llama.cpp could not run (e.g. it crashed): no figure, the reason
    load_start = os.getloadavg()[0]
    try:
        for name, (mine, theirs) in measures.items():
            mine(0)  # warm-up: the engine's first run of a shape
            for r in range(settings.runs):
                for side, measure in (("ours", mine), ("llama.cpp", theirs)):
                    if side == "llama.cpp" and name in errors:
                        continue
                    try:
                        figures[side].setdefault(name, []).append(measure(r + 1))
                    except subprocess.CalledProcessError as error:  # the peer's fault: this row only
                        errors[name] = failure(error)
                        figures[side].pop(name, None)
                        if log:
                            print(f"[peer] {name} {side}: no figure ({errors[name]})", file=log, flush=True)
                        continue
                    if log:
                        print(f"[peer] {name} {side}: {figures[side][name][-1]:.1f} (load "
                              f"{os.getloadavg()[0]:.1f})", file=log, flush=True)
    finally:
        ours.close()
    result = {side: {k: _median(v) for k, v in values.items()} for side, values in figures.items()}
    ratios = {}
    for name in measures:
        a, theirs = result["ours"][name], result["llama.cpp"].get(name)
        ratios[name] = None if theirs is None else \
            round(theirs / a if name == "ttft_ms" else a / theirs, 2)  # > 1: ours is better
    return {**result, "samples": figures, "ratios": ratios, "errors": errors, "load_avg": [round(load_start, 2),
                                                                         round(os.getloadavg()[0], 2)],
            "gguf": gguf.name, "quant": quant + (", int8 activations" if int8_activations else "")
                     + (", bf16 activations" if bf16_activations else "")
                     + (", int16 activations" if int16_activations else ""),
            "peer_build": variant.name}


def format_peer(result: dict, settings) -> str:
    """The comparison as a markdown table, with the run's load average."""
    names = {"decode_tok_s": "decode tok/s, batch 1", "ttft_ms": f"TTFT ms, {TTFT_PROMPT}-token prompt",
             "prefill_tok_s": f"prefill tok/s, {PREFILL_PROMPT}-token prompt"}
    build = result.get("peer_build", "native")
    lines = [f"| {result['gguf']} | ours ({result['quant']}) | llama.cpp ({build} build) | ours / llama.cpp |",
             "|---|---:|---:|---:|"]
    for key, ratio in result["ratios"].items():
        label = names.get(key, f"batch {settings.batch} aggregate tok/s (prefills included)")
        if ratio is None:
            reason = result.get("errors", {}).get(key, "no figure")
            lines.append(f"| {label} | {result['ours'][key]:.1f} | none: {reason} | - |")
            continue
        lines.append(f"| {label} | {result['ours'][key]:.1f} | {result['llama.cpp'][key]:.1f} | {ratio:.2f}x |")
    lines.append("")
    lines.append(f"Alternating ours / llama.cpp, median of {settings.runs} rounds after a warm-up, {settings.threads} "
                 f"threads, {settings.tokens} greedy tokens; ratios > 1 favour ours (TTFT: theirs / ours); "
                 f"1-min load average {result['load_avg'][0]} at start, {result['load_avg'][1]} at end.")
    return "\n".join(lines)
