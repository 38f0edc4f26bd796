"""The benchmark's llama.cpp rows (llama-cpp-python, when importable; never a dependency): batch 1
through its high-level ``Llama`` API, and batch N through the low-level batch API, the way
llama.cpp's own ``batched`` example decodes several sequences in one ``llama_decode`` per step.

With ``VOXLANE_LLAMA_CPP_NO_EXTRA_BUFFERS=1`` llama.cpp's extra weight buffer types (AMX and the
repacked AVX layouts) are off: on this VM its AMX matmul crashes (SIGSEGV in
``ggml_backend_amx_mul_mat``; likely the GCC 12 tile-config miscompile that
``bench.llama_cpp_build`` works around for the native peer, not checked for these wheels), and
``bench.engine`` retries a crashed group that way.
"""
from __future__ import annotations

import os
import time
from types import SimpleNamespace

import numpy as np

from bench.engine_rows import SHORT_PROMPT, BenchSettings, batch_prompts, long_prompt, median, row, rss_mb


def chatml(messages: list[dict]) -> str:
    """A one-message user chat in SmolLM2's chat format, ready for the answer."""
    (message,) = messages
    return f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>\n<|im_start|>assistant\n"


def llama_cpp_rows(gguf_path, settings: BenchSettings, label: str = "GGUF as packaged") -> list[dict]:
    """Rows 'llama.cpp (label)' (batch 1) and, for a batch over 1, 'llama.cpp (label) (batch N)';
    [] when llama-cpp-python is not installed."""
    try:
        from llama_cpp import Llama
        from llama_cpp import llama_cpp  # the low-level module, whose defaults Llama reads
    except ImportError:
        return []
    no_extra = os.environ.get("VOXLANE_LLAMA_CPP_NO_EXTRA_BUFFERS") == "1"
    if no_extra:
        defaults = llama_cpp.llama_model_default_params

        def without_extra_buffers():
            params = defaults()
            params.use_extra_bufts = False
            return params

        llama_cpp.llama_model_default_params = without_extra_buffers
    llm = Llama(model_path=str(gguf_path), n_threads=settings.threads, n_ctx=1024, verbose=False)
    eos = llm.token_eos()
    name = f"llama.cpp ({label}{', no AMX/repack buffers' if no_extra else ''})"

    def no_eos(input_ids, scores):
        scores[eos] = -float("inf")
        return scores

    def timed(prompt: str, n: int) -> float:
        llm.reset()  # or it reuses the cached prompt: a "TTFT" of 1 ms, and no prefill in the total
        start = time.perf_counter()
        llm.create_completion(prompt, max_tokens=n, temperature=0.0, logits_processor=[no_eos])
        return time.perf_counter() - start

    prompt = chatml(SHORT_PROMPT)  # the engine rows' prompts, in SmolLM2's chat format
    timed(prompt, 4)
    ttft = median([timed(prompt, 1) for _ in range(settings.runs)])
    total = median([timed(prompt, settings.tokens) for _ in range(settings.runs)])
    tokenizer = SimpleNamespace(encode=lambda text: llm.tokenize(text.encode()))  # what long_prompt asks of one
    long = chatml(long_prompt(tokenizer, settings.prefill_tokens))
    prefill = len(llm.tokenize(long.encode(), special=True)) / median([timed(long, 1) for _ in range(settings.runs)])
    rows = [row(name, ms_per_token=(total - ttft) / max(settings.tokens - 1, 1) * 1e3,
                tok_s_stream=settings.tokens / total, tok_s_aggregate=settings.tokens / total, ttft_ms=ttft * 1e3,
                prefill_tok_s=prefill, rss_mb=rss_mb(), batch=1)]
    if settings.batch > 1:
        wall = BatchedGreedy(llm, settings).median_wall()
        aggregate = settings.batch * settings.tokens / wall
        rows.append(row(f"{name} (batch {settings.batch})", ms_per_token=1e3 / aggregate * settings.batch,
                        tok_s_stream=settings.tokens / wall, tok_s_aggregate=aggregate, rss_mb=rss_mb(),
                        batch=settings.batch))
    return rows


class BatchedGreedy:
    """N prompts (the engine rows' batch prompts) decoded greedily together, EOS masked: all prompts
    in one ``llama_decode``, then one call per step with every sequence's next token."""

    def __init__(self, llm, settings: BenchSettings):
        from llama_cpp import llama_cpp

        self.api, self.settings = llama_cpp, settings
        self.prompts = [llm.tokenize(chatml(messages).encode(), add_bos=False, special=True)
                        for messages in batch_prompts(settings.batch)]
        params = llama_cpp.llama_context_default_params()
        per_sequence = max(map(len, self.prompts)) + settings.tokens + 8
        params.n_ctx = settings.batch * per_sequence
        params.n_seq_max = settings.batch  # each sequence its own KV cells
        params.n_batch = params.n_ubatch = max(512, sum(map(len, self.prompts)))
        params.n_threads = params.n_threads_batch = settings.threads
        self.llm = llm  # owns the model this context uses
        self.ctx = llama_cpp.llama_init_from_model(llm._model.model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp: could not create a batched context")
        vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
        self.vocab_size, self.eos = llama_cpp.llama_vocab_n_tokens(vocab), llama_cpp.llama_vocab_eos(vocab)
        self.batch = llama_cpp.llama_batch_init(params.n_batch, 0, 1)

    def _decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of (token, position, sequence, wants logits) entries."""
        for i, (token, position, seq, wants) in enumerate(entries):
            self.batch.token[i], self.batch.pos[i], self.batch.logits[i] = token, position, wants
            self.batch.n_seq_id[i], self.batch.seq_id[i][0] = 1, seq
        self.batch.n_tokens = len(entries)
        if self.api.llama_decode(self.ctx, self.batch) != 0:
            raise RuntimeError("llama.cpp: llama_decode failed")

    def _next_token(self, index: int) -> int:
        logits = np.ctypeslib.as_array(self.api.llama_get_logits_ith(self.ctx, index), shape=(self.vocab_size,))
        masked = logits.copy()
        masked[self.eos] = -np.inf
        return int(masked.argmax())

    def run(self) -> float:
        """Wall seconds for ``tokens`` new tokens of every sequence, from an empty cache."""
        self.api.llama_memory_clear(self.api.llama_get_memory(self.ctx), True)
        start = time.perf_counter()
        entries = [(t, p, s, p == len(ids) - 1) for s, ids in enumerate(self.prompts) for p, t in enumerate(ids)]
        self._decode(entries)
        logit_rows = [i for i, entry in enumerate(entries) if entry[3]]  # one per sequence, in order
        positions = [len(ids) for ids in self.prompts]
        for step in range(self.settings.tokens):
            tokens = [self._next_token(i) for i in logit_rows]
            if step == self.settings.tokens - 1:
                break
            self._decode([(t, positions[s], s, True) for s, t in enumerate(tokens)])
            logit_rows, positions = list(range(len(tokens))), [p + 1 for p in positions]
        return time.perf_counter() - start

    def median_wall(self) -> float:
        try:
            self.run()  # warm-up
            return median([self.run() for _ in range(self.settings.runs)])
        finally:
            self.api.llama_batch_free(self.batch)
            self.api.llama_free(self.ctx)
