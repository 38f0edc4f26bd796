"""``LLMEngine``: submit requests, get streams of text deltas; one step loop decodes them together.

    step() = schedule -> run (one forward of prefill chunks, one batched decode) -> postprocess (sample, detokenize,
    stop checks, push deltas)

By default a background thread runs steps whenever there is work; ``background=False`` leaves the
stepping to the caller (tests, benchmarks). ``submit`` and ``cancel`` are safe from any thread: they
go through a locked inbox that the step drains, so the scheduler itself is only touched by the
stepping thread.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.detokenizer import IncrementalDetokenizer
from engine.int8_checkpoint import has_int8_checkpoint
from engine.kernels import load_kernels
from engine.kv_cache import KVCache, common_prefix_length
from engine.loader import load_config, load_int8_model, load_model, load_tokenizer, release_file_memory, trim_heap
from engine.native_weights import load_native_model
from engine.open_turn import open_user_turn_ids, sentence_end_token_ids
from engine.quant import quantize_int8, weight_bytes
from engine.runner import ModelRunner
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence, SequenceIds
from engine.stop_strings import StopStringFilter
from engine.stream import TokenStream

Prompt = list[dict] | list[int] | str  # chat messages, token ids, or raw text
log = logging.getLogger(__name__)


@dataclass
class EngineStats:
    """A snapshot for metrics and the UI."""

    waiting: int  # queue depth
    running: int
    slots_busy: int
    slots_held: int  # conversations keeping a slot warm
    num_slots: int
    tokens_generated: int
    tokens_per_s: float  # generated tokens per second over the last few seconds, all streams
    steps: int


@dataclass
class _Request:
    """Engine-side output state of one sequence."""

    stream: TokenStream
    detokenizer: IncrementalDetokenizer
    stop_filter: StopStringFilter
    ignore_eos: bool = False  # benchmarks: always generate max_tokens


class LLMEngine:
    """Our engine on one model directory (HF safetensors or .gguf) with an ``EngineConfig``."""

    def __init__(self, model_path: str | Path, config: EngineConfig | None = None, *, background: bool = True):
        self.config = config or EngineConfig()
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)
        self.num_threads = torch.get_num_threads()
        self.tokenizer = load_tokenizer(model_path)
        hf_config = load_config(model_path)
        self.sampler = Sampler()
        self.eos_ids = self._end_of_turn_ids(hf_config)
        self._ids = SequenceIds()
        self._requests: dict[int, _Request] = {}
        self._lock = threading.Condition()
        self._inbox: deque[Sequence] = deque()
        self._cancel_inbox: list[int] = []
        self._session_drops: list[tuple[str, threading.Event]] = []
        self._prefix_requests: list[tuple[list[int], threading.Event]] = []
        self.num_prefix_prefills = 0  # shared prefixes computed (each once, however many sessions use it)
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens) of recent steps
        self._tokens_generated = 0
        self._steps = 0
        self._sentence_end_ids: frozenset[int] | None = None
        self._closed = False
        self._thread: threading.Thread | None = None
        if not background:
            self._build(model_path)
            return
        # The thread builds the model too, so that it is the process's only thread running torch's
        # multi-threaded (OpenMP) ops: when a second thread also owns an OpenMP team, libgomp
        # throttles every barrier and each parallel op waits for a sleeping worker (measured: a
        # 381-token prefill 268 ms on the loading thread, 439 ms on another).
        ready, failure = threading.Event(), []
        self._thread = threading.Thread(target=self._thread_main, args=(model_path, ready, failure),
                                        name="voxlane-engine", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]

    def _build(self, model_path: str | Path) -> None:
        """Model (quantized as configured), kernels, KV cache, runner and scheduler."""
        torch.set_num_threads(self.num_threads)  # per thread: the stepping thread needs its own
        kernels = load_kernels() if self.config.kernels else None  # None: the pure-torch path
        dtype, max_seq_len = self.config.torch_dtype, self.config.max_seq_len
        if self.config.quant == "native":  # the GGUF's blocks, copied out of the file as they are
            self.model = load_native_model(model_path, max_seq_len, kernels)
            trim_heap()
        elif self.config.quant == "int8" and has_int8_checkpoint(model_path):  # prepared once: no fp32 pass
            self.model = load_int8_model(model_path, dtype, max_seq_len, kernels)
            release_file_memory(self.model)
        else:
            self.model = load_model(model_path, dtype, max_seq_len)
            self.model.kernels = kernels
            if self.config.quant == "int8":
                quantize_int8(self.model)
            release_file_memory(self.model)
        self.weight_bytes = weight_bytes(self.model)
        self.max_seq_len = self.model.max_seq_len
        self.kv_cache = KVCache(self.model.args, self.config.num_slots, self.max_seq_len, self.config.torch_dtype,
                                self.config.num_shared_prefixes)
        self.runner = ModelRunner(self.model, self.kv_cache, compile=self.config.compile)
        self.scheduler = Scheduler(self.kv_cache, self.config.max_batch_size, self.config.prefill_chunk_tokens)

    def _thread_main(self, model_path: str | Path, ready: threading.Event, failure: list) -> None:
        try:
            self._build(model_path)
        except BaseException as error:  # the constructor re-raises it
            failure.append(error)
            return
        finally:
            ready.set()
        self._loop()

    def _end_of_turn_ids(self, hf_config) -> set[int]:
        ids: set[int] = set()
        for value in (getattr(hf_config, "eos_token_id", None), self.tokenizer.eos_token_id):
            ids.update(value if isinstance(value, (list, tuple)) else [value] if value is not None else [])
        for token in ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>"):
            token_id = self.tokenizer.convert_tokens_to_ids(token)
            if isinstance(token_id, int) and token_id != self.tokenizer.unk_token_id:
                ids.add(token_id)
        return ids

    # ---- requests ----
    def encode(self, prompt: Prompt) -> list[int]:
        """Chat messages -> ids with the chat template (and generation prompt); ids pass through."""
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt, add_special_tokens=False))
        if prompt and isinstance(prompt[0], int):
            return list(prompt)
        ids = self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def encode_open_user_turn(self, messages: list[dict]) -> list[int] | None:
        """The chat template cut right after the last user message's text: no end of turn, no
        assistant header. What the model reads as "the user has said this so far". None when the
        template does not render that text verbatim."""
        return open_user_turn_ids(self.tokenizer, messages)

    def sentence_end_ids(self) -> frozenset[int]:
        """Tokens that end a sentence (".", "?", "!" first) or the turn (the end-of-turn ids)."""
        if self._sentence_end_ids is None:
            self._sentence_end_ids = sentence_end_token_ids(self.tokenizer, self.eos_ids)
        return self._sentence_end_ids

    def submit(self, prompt: Prompt, sampling: SamplingParams | None = None, session: str | None = None, *,
               ignore_eos: bool = False, probe_ids: frozenset[int] | None = None) -> TokenStream:
        """Queue a request; returns its stream at once. ``session`` keeps the KV cache between turns;
        ``ignore_eos`` (benchmarks) generates ``max_tokens`` whatever the model says.

        ``probe_ids`` makes it a probe: the prompt is prefilled (into the session's slot, which keeps
        it, so a request that extends the prompt next prefills only the rest) and, instead of
        sampling, ``stream.probe`` = P(next token in probe_ids); the stream ends "probed", no text."""
        sampling = sampling or SamplingParams()
        ids = self.encode(prompt)
        if not ids:
            raise ValueError("prompt: empty")
        if len(ids) >= self.max_seq_len:
            raise ValueError(f"prompt: {len(ids)} tokens do not fit max_seq_len {self.max_seq_len}")
        seq = Sequence(self._ids.next(), ids, sampling, session, probe_ids=probe_ids)
        stream = TokenStream(seq.id, self.cancel)
        stream.prompt_tokens = len(ids)
        self._requests[seq.id] = _Request(stream, IncrementalDetokenizer(self.tokenizer, ids),
                                          StopStringFilter(sampling.stop), ignore_eos)
        with self._lock:
            if self._closed:
                raise RuntimeError("engine is closed")
            self._inbox.append(seq)
            self._lock.notify()
        return stream

    def cancel(self, request_id: int) -> None:
        """End a request at the next step and free its slot (a finished request: no effect)."""
        with self._lock:
            self._cancel_inbox.append(request_id)
            self._lock.notify()

    def generate(self, prompt: Prompt, sampling: SamplingParams | None = None, session: str | None = None) -> str:
        """Blocking convenience: the whole answer (steps itself when there is no background thread)."""
        stream = self.submit(prompt, sampling, session)
        if self._thread is None:
            self.run_until_idle()
        return stream.text()

    def drop_session(self, session: str) -> None:
        """Forget a conversation's cached tokens (its slot is reused). With the background thread the
        stepping thread applies it (the cache is its alone) and this call waits for that."""
        if self._thread is None:
            self.kv_cache.drop_session(session)
            return
        done = threading.Event()
        with self._lock:
            self._session_drops.append((session, done))
            self._lock.notify()
        done.wait(timeout=10)

    def share_prefix(self, prompt: Prompt) -> threading.Event:
        """Prefill ``prompt``'s tokens once into a read-only shared row of the KV cache: every later
        request whose prompt starts with them (any session) copies their k/v instead of computing
        them. For a persona's system prompt (``system_prefix_ids``). Returns an event set when the
        prefix is ready (or cannot be kept: no shared rows configured, or too long)."""
        ids, done = self.encode(prompt), threading.Event()
        with self._lock:
            self._prefix_requests.append((ids, done))
            self._lock.notify()
        return done

    def system_prefix_ids(self, system_prompt: str) -> list[int]:
        """The chat template's tokens up to where the first user message's text begins, after a
        system message: the part every conversation with that system prompt shares."""
        a, b = (self.encode([{"role": "system", "content": system_prompt}, {"role": "user", "content": text}])
                for text in ("a", "b"))
        return a[: common_prefix_length(a, b)]

    # ---- the step loop ----
    @property
    def has_work(self) -> bool:
        return bool(self._inbox or self._cancel_inbox or self._session_drops or self._prefix_requests
                    or self.scheduler.has_work)

    def _prefill_shared_prefix(self, ids: list[int]) -> None:
        prefix = self.kv_cache.reserve_prefix(ids)
        if prefix is None or prefix.is_ready:
            return
        chunk = self.config.prefill_chunk_tokens
        for start in range(0, len(ids), chunk):
            self.runner.prefill(prefix.row, ids[start: start + chunk], start, want_logits=False)
        self.kv_cache.mark_prefix_ready(prefix)
        self.num_prefix_prefills += 1

    def step(self) -> None:
        """schedule -> run -> postprocess, once."""
        self._drain_inbox()
        plan = self.scheduler.schedule()
        for seq in plan.cancelled:
            self._close(seq)
        new_tokens = 0
        # A chunk that ends its prompt wants logits: they pick the sequence's first new token.
        chunks = [(seq.slot, seq.prompt_ids[start:end], start, end == len(seq.prompt_ids))
                  for seq, start, end in plan.prefills]
        seqs = plan.decode
        decode = ([s.slot for s in seqs], [s.last_token for s in seqs], [s.num_tokens - 1 for s in seqs])
        if chunks and seqs and self.runner.fused_decode:  # one pass over the weights for both
            prefill_logits, decode_logits = self.runner.prefill_and_decode(chunks, *decode)
        else:
            prefill_logits = self.runner.prefill_many(chunks) if chunks else []
            decode_logits = self.runner.decode(*decode) if seqs else None
        for (seq, _, end), logits in zip(plan.prefills, prefill_logits):
            seq.num_cached = end
            if logits is not None and seq.probe_ids is not None:
                self._finish_probe(seq, logits)
            elif logits is not None:
                new_tokens += self._postprocess([seq], logits[None])
        if seqs:
            for seq in seqs:
                seq.num_cached += 1
            new_tokens += self._postprocess(seqs, decode_logits)
        self._steps += 1
        self._record(new_tokens)

    def _postprocess(self, seqs: list[Sequence], logits: torch.Tensor) -> int:
        """Samples and appends one token per sequence (logits [B, V]); returns how many were added.
        A fault one request causes (its sampling settings, its text) ends that request alone, with
        the error; the others keep decoding. (A fault in the batched forward itself cannot be
        pinned on one request: ``_loop`` ends the running ones.)"""
        try:
            tokens = self.sampler.sample(logits, seqs)
        except Exception:  # some row's own settings: sample row by row to find it
            tokens = [self._sample_alone(seq, logits[i:i + 1]) for i, seq in enumerate(seqs)]
        added = 0
        for seq, token in zip(seqs, tokens):
            if token is None:
                continue
            try:
                self._append(seq, token)
                added += 1
            except Exception as error:
                self._fail(seq, error)
        return added

    def _sample_alone(self, seq: Sequence, logits: torch.Tensor) -> int | None:
        try:
            return self.sampler.sample(logits, [seq])[0]
        except Exception as error:
            self._fail(seq, error)
            return None

    def _fail(self, seq: Sequence, error: BaseException) -> None:
        log.warning("request %d failed on the engine thread, alone: %r", seq.id, error)
        self.scheduler.finish(seq, "error")
        self._close(seq, error)

    def run_until_idle(self, max_steps: int | None = None) -> None:
        """Step until no request is left (for ``background=False`` use)."""
        steps = 0
        while self.has_work and (max_steps is None or steps < max_steps):
            self.step()
            steps += 1

    def _drain_inbox(self) -> None:
        with self._lock:
            arrived, self._inbox = list(self._inbox), deque()
            cancels, self._cancel_inbox = self._cancel_inbox, []
            drops, self._session_drops = self._session_drops, []
            prefixes, self._prefix_requests = self._prefix_requests, []
        for session, done in drops:
            self.kv_cache.drop_session(session)
            done.set()
        for ids, done in prefixes:
            try:
                self._prefill_shared_prefix(ids)
            finally:
                done.set()
        for seq in arrived:
            self.scheduler.add(seq)
        for request_id in cancels:
            if request_id in self._requests:
                self.scheduler.cancel(request_id)

    def _append(self, seq: Sequence, token: int) -> None:
        """Postprocess one new token: end of turn, text delta, stop strings, limits."""
        request = self._requests[seq.id]
        if seq.first_token_s is None:
            seq.first_token_s = time.perf_counter()
            request.stream.ttft_s = seq.ttft_s
            request.stream.first_token_at = seq.first_token_s
            request.stream.cached_tokens = seq.num_reused
        if token in self.eos_ids and not request.ignore_eos:
            return self._finish(seq, "stop")
        seq.output_ids.append(token)
        text, hit_stop = request.stop_filter.feed(request.detokenizer.add(token))
        if text:
            request.stream.put(text)
        if hit_stop:
            self._finish(seq, "stop")
        elif len(seq.output_ids) >= seq.sampling.max_tokens or seq.num_tokens >= self.max_seq_len:
            self._finish(seq, "length")

    def _finish_probe(self, seq: Sequence, logits: torch.Tensor) -> None:
        """A probe's prompt is cached: P(next token in probe_ids) from its logits [V], no token sampled."""
        probs = logits.float().softmax(-1)
        ids = torch.tensor(sorted(seq.probe_ids), dtype=torch.long)
        stream = self._requests[seq.id].stream
        stream.probe = float(probs[ids].sum()) if len(ids) else 0.0
        stream.cached_tokens = seq.num_reused
        self._finish(seq, "probed")

    def _finish(self, seq: Sequence, reason: str) -> None:
        # Text held back as a possible stop-string start is real output once the answer ends
        # (after a stop-string hit nothing is held).
        tail = self._requests[seq.id].stop_filter.flush()
        if tail:
            self._requests[seq.id].stream.put(tail)
        self.scheduler.finish(seq, reason)
        self._close(seq)

    def _close(self, seq: Sequence, error: BaseException | None = None) -> None:
        request = self._requests.pop(seq.id, None)
        self.sampler.forget(seq.id)
        if request is not None:
            request.stream.output_ids = list(seq.output_ids)
            request.stream.close(seq.finish_reason or "error", error)

    def _record(self, new_tokens: int) -> None:
        now = time.perf_counter()
        self._tokens_generated += new_tokens
        self._recent.append((now, new_tokens))
        while self._recent and now - self._recent[0][0] > 5.0:
            self._recent.popleft()

    def _loop(self) -> None:
        window_s = self.config.admission_window_ms / 1000.0
        while True:
            with self._lock:
                while not self._closed and not self.has_work:
                    self._lock.wait()
                if self._closed:
                    return
                was_idle = not self.scheduler.running
            if was_idle and window_s > 0:
                time.sleep(window_s)  # requests arriving together start together (one batch)
            try:
                self.step()
            except BaseException as error:  # a batched forward failed: never die silently
                self._fail_running(error)

    def _fail_running(self, error: BaseException) -> None:
        """Ends the sequences that were in the failed forward; the waiting ones were not in it."""
        log.exception("engine step failed; ending the %d running requests", len(self.scheduler.running))
        for seq in list(self.scheduler.running):
            self.scheduler.finish(seq, "error")
            self._close(seq, error)

    # ---- introspection ----
    def stats(self) -> EngineStats:
        recent = list(self._recent)
        span = recent[-1][0] - recent[0][0] if len(recent) > 1 else 0.0
        rate = sum(n for _, n in recent[1:]) / span if span > 0 else 0.0
        return EngineStats(waiting=len(self.scheduler.waiting) + len(self._inbox), running=len(self.scheduler.running),
                           slots_busy=self.kv_cache.num_busy, slots_held=self.kv_cache.num_sessions,
                           num_slots=len(self.kv_cache.slots), tokens_generated=self._tokens_generated,
                           tokens_per_s=rate, steps=self._steps)

    @property
    def num_open_requests(self) -> int:
        return len(self._requests)

    def close(self) -> None:
        """Stop the loop; open requests end as cancelled."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for session, done in self._session_drops:
            self.kv_cache.drop_session(session)
            done.set()
        for _, done in self._prefix_requests:
            done.set()
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            self.scheduler.finish(seq, "cancelled")
            self._close(seq)
        for seq in list(self._inbox):
            seq.finish_reason = "cancelled"
            self._close(seq)
