"""One measurement per benchmark row: our engine in each configuration, and the peers
(transformers ``generate`` fp32 and ``quantize_dynamic`` int8; llama.cpp's are in ``bench.llama_cpp``).

Every function returns a plain dict row with the same keys (None where a figure does not apply):
  ms_per_token      decode time per token of one stream (after the first token)
  tok_s_stream      new tokens per second of one stream, first token included
  tok_s_aggregate   new tokens per second over all streams of the batch (wall clock)
  ttft_ms           time to first token, short chat prompt, batch 1
  prefill_tok_s     prompt tokens per second for a ~500-token prompt
  rss_mb            resident memory of the process after the row
  weights_mb        bytes of weights (each storage once)
  tokens_per_step   our engine: new tokens per engine step over the measured runs (a count, not a
                    time: about 1 for one stream, up to the batch size when the streams run together)
Each figure is the median over ``runs`` runs after one warm-up.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import psutil
import torch

SHORT_PROMPT = [{"role": "user", "content": "Tell me a story about a lighthouse keeper."}]
BATCH_TOPICS = ("a lighthouse keeper", "a lost robot", "the first snow", "a city of cats", "a tiny dragon",
                "a night train", "a talking tree", "a brave snail")
LONG_TEXT = ("The history of lighthouses begins with fires lit on hilltops to guide ships at night. "
             "Later, towers were built and lamps with mirrors and lenses made the light visible far out at sea. ")


@dataclass(frozen=True)
class BenchSettings:
    """What every row measures with."""

    tokens: int = 128
    runs: int = 3
    batch: int = 8
    prefill_tokens: int = 500
    threads: int = 2


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def batch_prompts(n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"Tell me a story about {BATCH_TOPICS[i % len(BATCH_TOPICS)]}."}]
            for i in range(n)]


def long_prompt(tokenizer, n_tokens: int) -> list[dict]:
    """A chat whose template renders to about ``n_tokens`` tokens."""
    text = LONG_TEXT
    while len(tokenizer.encode(text)) < n_tokens - 30:
        text += LONG_TEXT
    return [{"role": "user", "content": text + "\nSummarize this."}]


def row(name: str, **figures) -> dict:
    keys = ("ms_per_token", "tok_s_stream", "tok_s_aggregate", "ttft_ms", "prefill_tok_s", "rss_mb", "weights_mb")
    return {"name": name, **{k: figures.get(k) for k in keys}, **{k: v for k, v in figures.items() if k not in keys}}


# ---- our engine ----
def engine_rows(model_dir, quant: str, settings: BenchSettings, label: str,
                int16_activations: bool = False) -> list[dict]:
    """Rows '+ KV cache' style (batch 1) and '+ batching' (batch N) for one engine configuration."""
    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from engine.sampling_params import SamplingParams

    config = EngineConfig(dtype="float32", quant=quant, max_batch_size=max(settings.batch, 1),
                          num_slots=max(settings.batch, 1), max_seq_len=1024, admission_window_ms=0,
                          prefill_chunk_tokens=512, num_threads=settings.threads,
                          int16_activations=int16_activations)
    engine = LLMEngine(model_dir, config)  # the background thread, as the app uses it
    greedy = SamplingParams(temperature=0.0, max_tokens=settings.tokens)

    def one_stream() -> tuple[float, float, float]:
        start = time.perf_counter()
        stream = engine.submit(SHORT_PROMPT, greedy, ignore_eos=True)
        stream.text()
        n = len(stream.output_ids)
        decode_s = stream.finished_at - stream.first_token_at
        return decode_s / max(n - 1, 1) * 1e3, n / (stream.finished_at - start), stream.ttft_s * 1e3

    def batch_run() -> tuple[float, float]:
        start = time.perf_counter()
        streams = [engine.submit(p, greedy, ignore_eos=True) for p in batch_prompts(settings.batch)]
        for s in streams:
            s.text()
        end = max(s.finished_at for s in streams)
        per_stream = median([len(s.output_ids) / (s.finished_at - start) for s in streams])
        return sum(len(s.output_ids) for s in streams) / (end - start), per_stream

    def prefill_run() -> float:
        prompt = long_prompt(engine.tokenizer, settings.prefill_tokens)
        stream = engine.submit(prompt, SamplingParams(temperature=0.0, max_tokens=1))
        stream.text()
        return stream.prompt_tokens / stream.ttft_s

    def per_step(run, count: int) -> tuple[list, float]:
        """``count`` runs, and the new tokens per engine step they took together."""
        steps, tokens = engine.stats().steps, engine.stats().tokens_generated
        results = [run() for _ in range(count)]
        return results, (engine.stats().tokens_generated - tokens) / max(1, engine.stats().steps - steps)

    try:
        one_stream()  # warm-up
        singles, single_per_step = per_step(one_stream, settings.runs)
        prefill = median([prefill_run() for _ in range(settings.runs)])
        ms, tps, ttft = (median([s[i] for s in singles]) for i in range(3))
        weights = engine.weight_bytes / 2**20
        rows = [row(f"+ {label}" if label else "+ KV cache", ms_per_token=ms, tok_s_stream=tps,
                    tok_s_aggregate=tps, ttft_ms=ttft, prefill_tok_s=prefill, rss_mb=rss_mb(),
                    weights_mb=weights, batch=1, tokens_per_step=round(single_per_step, 2))]
        if settings.batch > 1:
            batch_run()  # warm-up
            batches, batch_per_step = per_step(batch_run, settings.runs)
            aggregate = median([b[0] for b in batches])
            rows.append(row(f"+ {label + ' + ' if label else ''}batching (batch {settings.batch})",
                            ms_per_token=1e3 * settings.batch / aggregate, tok_s_stream=median([b[1] for b in batches]),
                            tok_s_aggregate=aggregate, rss_mb=rss_mb(), weights_mb=weights, batch=settings.batch,
                            tokens_per_step=round(batch_per_step, 2)))
        return rows
    finally:
        engine.close()


def conversation_ttft(model_dir, settings: BenchSettings, turns: int = 5) -> list[float]:
    """TTFT (ms) of each turn of one conversation kept in its slot (int8 default engine)."""
    from engine.config import EngineConfig
    from engine.backends.engine_backend import EngineBackend
    from engine.sampling_params import SamplingParams

    backend = EngineBackend(model_dir, EngineConfig(num_threads=settings.threads, admission_window_ms=0,
                                                    max_seq_len=2048))
    questions = ["Hi! Who are you?", "What's a good name for a cat?", "Why do cats purr?",
                 "How long do cats sleep?", "Give me one fun fact about cats.", "Thanks!"]
    history = [{"role": "system", "content": "You are a friendly voice assistant. Answer briefly."}]
    ttfts = []
    try:
        for question in questions[:turns]:
            history.append({"role": "user", "content": question})
            generation = backend.generate(history, SamplingParams(temperature=0.0, max_tokens=min(48, settings.tokens)),
                                          session="bench")
            answer = "".join(generation)
            ttfts.append(generation.ttft_s * 1e3)
            history.append({"role": "assistant", "content": answer})
    finally:
        backend.close()
    return ttfts


def no_cache_row(model_dir, settings: BenchSettings) -> dict:
    """Baseline: our fp32 model recomputing the whole sequence for every new token."""
    from engine.loader import chat_prompt_ids, load_model, load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    model = load_model(model_dir, torch.float32)
    ids = chat_prompt_ids(tokenizer, SHORT_PROMPT)

    @torch.inference_mode()
    def run(new_tokens: int = settings.tokens) -> tuple[float, float, float]:
        seq = list(ids)
        stamps = [time.perf_counter()]
        for _ in range(new_tokens):
            inputs = torch.tensor([seq])
            seq.append(int(model.logits(model(inputs, torch.arange(len(seq))[None])[0, -1]).argmax()))
            stamps.append(time.perf_counter())
        total = stamps[-1] - stamps[0]
        return (stamps[-1] - stamps[1]) / max(new_tokens - 1, 1) * 1e3, new_tokens / total, (stamps[1] - stamps[0]) * 1e3

    run(min(8, settings.tokens))  # warm-up (short: every token here recomputes the whole sequence)
    results = [run() for _ in range(settings.runs)]
    ms, tps, ttft = (median([r[i] for r in results]) for i in range(3))
    from engine.quant import weight_bytes

    return row("baseline (no KV cache)", ms_per_token=ms, tok_s_stream=tps, tok_s_aggregate=tps, ttft_ms=ttft,
               rss_mb=rss_mb(), weights_mb=weight_bytes(model) / 2**20, batch=1)


# ---- peers ----
def transformers_rows(model_dir, settings: BenchSettings, int8: bool) -> list[dict]:
    """transformers ``generate`` (greedy, KV cache) in fp32, or after ``quantize_dynamic`` int8."""
    import warnings

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if int8:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    name = "transformers generate, int8 quantize_dynamic" if int8 else "transformers generate, fp32"

    def encode(chats):
        texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
        return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)

    @torch.inference_mode()
    def timed(inputs, new_tokens: int) -> float:
        start = time.perf_counter()
        model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                       pad_token_id=tokenizer.pad_token_id or 2)
        return time.perf_counter() - start

    short = encode([SHORT_PROMPT])
    timed(short, 4)
    ttft = median([timed(short, 1) for _ in range(settings.runs)])
    total = median([timed(short, settings.tokens) for _ in range(settings.runs)])
    prompt = encode([long_prompt(tokenizer, settings.prefill_tokens)])
    prefill = prompt["input_ids"].shape[1] / median([timed(prompt, 1) for _ in range(settings.runs)])
    from engine.quant import weight_bytes

    weights = weight_bytes(model) / 2**20
    rows = [row(name, ms_per_token=(total - ttft) / max(settings.tokens - 1, 1) * 1e3,
                tok_s_stream=settings.tokens / total, tok_s_aggregate=settings.tokens / total,
                ttft_ms=ttft * 1e3, prefill_tok_s=prefill, rss_mb=rss_mb(), weights_mb=weights, batch=1)]
    if settings.batch > 1:
        batch = encode(batch_prompts(settings.batch))
        timed(batch, 4)
        wall = median([timed(batch, settings.tokens) for _ in range(settings.runs)])
        aggregate = settings.batch * settings.tokens / wall
        rows.append(row(f"{name} (batch {settings.batch})", ms_per_token=1e3 / aggregate * settings.batch,
                        tok_s_stream=settings.tokens / wall, tok_s_aggregate=aggregate, rss_mb=rss_mb(),
                        weights_mb=weights, batch=settings.batch))
    return rows
