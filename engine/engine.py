"""``LLMEngine``: submit requests, get streams of text deltas; one step loop decodes them together.

    step() = take the inbox -> plan = scheduler.schedule() -> tokens = runner.run(plan) (forwards and
    sampling) -> outputs (text deltas, stop checks, finish reasons) -> scheduler.postprocess(...)

By default a background thread (engine/step_loop.py) runs steps whenever there is work;
``background=False`` leaves the stepping to the caller (tests, benchmarks). ``submit`` and ``cancel``
are safe from any thread: they go through the locked inbox that the step drains, so the scheduler
itself is only touched by the stepping thread.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from engine import native_step
from engine.config import EngineConfig, WeightSetting
from engine.int8_checkpoint import has_int8_checkpoint
from engine.kernels import library_path, load_kernels
from engine.kv_cache import KVCache, common_prefix_length
from engine.loader import chat_prompt_ids, load_config, load_int8_model, load_model, load_tokenizer, release_file_memory, trim_heap
from engine.native_weights import load_native_model
from engine.open_turn import open_user_turn_ids, sentence_end_token_ids
from engine.outputs import OutputProcessor, end_of_turn_ids
from engine.quant import quantize_int8, weight_bytes
from engine.runner import ModelRunner, RunResult
from engine.sampler import Sampler, native_sample_row
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler, StepPlan
from engine.sequence import Sequence, SequenceIds
from engine.step_loop import Inbox, StepThread
from engine.stream import TokenStream

Prompt = list[dict] | list[int] | str  # chat messages, token ids, or raw text
log = logging.getLogger(__name__)


@contextlib.contextmanager
def _load_phase(name: str):
    """Logs how long a part of building the engine took, at debug level, in the form ``voxlane
    serve``'s start-up phases use (``startup: llm NAME S s``; ``voxlane bench startup`` reads them)."""
    started = time.monotonic()
    try:
        yield
    finally:
        log.debug("startup: llm %s %.3f s", name, time.monotonic() - started)


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


class LLMEngine:
    """Our engine on one model directory (HF safetensors or .gguf) with an ``EngineConfig``."""

    def __init__(self, model_path: str | Path, config: EngineConfig | None = None, *, background: bool = True):
        # "auto" with nobody who knows the model to choose (app/backends.py does): int8
        self.config = (config or EngineConfig()).with_weights(WeightSetting("int8"))
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)
        self.num_threads = torch.get_num_threads()
        with _load_phase("tokenizer"):
            self.tokenizer = load_tokenizer(model_path)
            self.eos_ids = end_of_turn_ids(self.tokenizer, load_config(model_path))
        self.sampler = Sampler()
        self.inbox = Inbox()
        self._ids = SequenceIds()
        self.num_prefix_prefills = 0  # shared prefixes computed (each once, however many sessions use it)
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens) of recent steps
        self._tokens_generated = 0
        self._steps = 0
        self._step_expected = False  # the last step told the runner that another follows (expect_step)
        self._sentence_end_ids: frozenset[int] | None = None
        self._step_thread: StepThread | None = None
        if not background:
            self._build(model_path)
            return
        self._step_thread = StepThread(self, lambda: self._build(model_path), self.config.admission_window_ms / 1000)
        self._step_thread.start()

    def _build(self, model_path: str | Path) -> None:
        """Model (quantized as configured), kernels, KV cache, runner, scheduler and output handling."""
        torch.set_num_threads(self.num_threads)  # per thread: the stepping thread needs its own
        with _load_phase("kernels"):
            kernels = load_kernels() if self.config.kernels else None  # None: the pure-torch path
            if kernels is not None:  # sampled rows' temperature, nucleus and draw in C
                self.sampler.native_row = native_sample_row(library_path())
        dtype, max_seq_len = self.config.torch_dtype, self.config.max_seq_len
        with _load_phase(f"weights {self.config.quant}"):
            self._load_weights(model_path, kernels, dtype, max_seq_len)
        self.model.int8_activations = self.config.int8_activations
        self.model.bf16_activations = self.config.bf16_activations
        self.model.int16_activations = self.config.int16_activations
        self.weight_bytes = weight_bytes(self.model)
        self.max_seq_len = self.model.max_seq_len
        kv_dtype = self.config.kv_torch_dtype(native_step.supports_model(self.model))
        self.kv_cache = KVCache(self.model.args, self.config.num_slots, self.max_seq_len, kv_dtype,
                                self.config.num_shared_prefixes)
        self.runner = ModelRunner(self.model, self.kv_cache, self.sampler, compile=self.config.compile)
        self.scheduler = Scheduler(self.kv_cache, self.config.max_batch_size, self.config.prefill_chunk_tokens)
        self.outputs = OutputProcessor(self.tokenizer, self.eos_ids, self.max_seq_len, self.cancel, self.hold)

    def _load_weights(self, model_path: str | Path, kernels, dtype: torch.dtype, max_seq_len: int) -> None:
        """``self.model``: the GGUF's blocks as stored (quant native), the int8 checkpoint by memory
        map (int8, prepared once by the model store), or the checkpoint quantized now."""
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

    # ---- requests ----
    def encode(self, prompt: Prompt) -> list[int]:
        """Chat messages -> ids with the chat template (and generation prompt); ids pass through."""
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt, add_special_tokens=False))
        if prompt and isinstance(prompt[0], int):
            return list(prompt)
        return chat_prompt_ids(self.tokenizer, prompt)

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
               ignore_eos: bool = False, probe_ids: frozenset[int] | None = None, probe_at: int | None = None,
               on_probe: Callable[[float], None] | None = None, hold_after: int | None = None) -> TokenStream:
        """Queue a request; returns its stream at once. ``session`` keeps the KV cache between turns;
        ``ignore_eos`` (benchmarks) generates ``max_tokens`` whatever the model says.

        ``probe_ids`` makes it a probe: the prompt is prefilled (into the session's slot, which keeps
        it, so a request that extends the prompt next prefills only the rest) and, instead of
        sampling, ``stream.probe`` = P(next token in probe_ids); the stream ends "probed", no text.
        With ``probe_at`` as well the request generates as usual, and the same prefill gives
        P(prompt token ``probe_at`` in probe_ids) from the logits before it: ``stream.probe``, and
        ``on_probe(p)`` called on the engine thread before the first token goes out (one request
        where a probe of the prompt's head and an answer were two).

        ``hold_after`` tokens written, the request waits (keeping its slot, costing no step) until
        ``stream.release()``: an answer started before it is known to be wanted (an early answer)."""
        sampling = sampling or SamplingParams()
        ids = self.encode(prompt)
        if not ids:
            raise ValueError("prompt: empty")
        if len(ids) >= self.max_seq_len:
            raise ValueError(f"prompt: {len(ids)} tokens do not fit max_seq_len {self.max_seq_len}")
        if probe_at is not None and (probe_ids is None or not 0 < probe_at < len(ids)):
            raise ValueError(f"probe_at: must be inside the prompt (1..{len(ids) - 1}) with probe_ids, got {probe_at}")
        if hold_after is not None and hold_after < 1:
            raise ValueError(f"hold_after: must be at least 1, got {hold_after}")
        seq = Sequence(self._ids.next(), ids, sampling, session, probe_ids=probe_ids, probe_at=probe_at,
                       hold_after=hold_after)
        stream = self.outputs.open(seq, ignore_eos)
        stream.on_probe = on_probe
        self.inbox.put_sequence(seq)
        return stream

    def cancel(self, request_id: int) -> None:
        """End a request at the next step and free its slot (a finished request: no effect)."""
        self.inbox.put_cancel(request_id)

    def hold(self, request_id: int, held: bool = True) -> None:
        """Held, a request writes no more tokens after the next step's (keeping its slot, costing no
        step) until it is released (``held=False``): e.g. while the first words' audio is made, so
        that synthesis has the CPU. A request submitted with ``hold_after`` is released the same way."""
        self.inbox.put_hold(request_id, held)

    def generate(self, prompt: Prompt, sampling: SamplingParams | None = None, session: str | None = None) -> str:
        """Blocking convenience: the whole answer (steps itself when there is no background thread)."""
        stream = self.submit(prompt, sampling, session)
        if self._step_thread is None:
            self.run_until_idle()
        return stream.text()

    def drop_session(self, session: str) -> None:
        """Forget a conversation's cached tokens (its slot is reused). With the background thread the
        stepping thread applies it (the cache is its alone) and this call waits for that."""
        if self._step_thread is None:
            self.kv_cache.drop_session(session)
            return
        self.inbox.put_session_drop(session).wait(timeout=10)

    def share_prefix(self, prompt: Prompt) -> threading.Event:
        """Prefill ``prompt``'s tokens once into a read-only shared row of the KV cache: every later
        request whose prompt starts with them (any session) copies their k/v instead of computing
        them. For a persona's system prompt (``system_prefix_ids``). Returns an event set when the
        prefix is ready (or cannot be kept: no shared rows configured, or too long)."""
        return self.inbox.put_shared_prefix(self.encode(prompt))

    def system_prefix_ids(self, system_prompt: str) -> list[int]:
        """The chat template's tokens up to where the first user message's text begins, after a
        system message: the part every conversation with that system prompt shares."""
        a, b = (self.encode([{"role": "system", "content": system_prompt}, {"role": "user", "content": text}])
                for text in ("a", "b"))
        return a[: common_prefix_length(a, b)]

    # ---- the step ----
    @property
    def has_work(self) -> bool:
        return bool(self.inbox or self.scheduler.has_work)

    def step(self) -> bool:
        """inbox -> schedule -> run -> outputs -> postprocess, once. Returns whether it did anything.

        A plan may hold prompt chunks and a decode batch; the runner runs both (one native call
        when it can) before any of their tokens go out."""
        expected, self._step_expected = self._step_expected, False  # (False if this step raises)
        if not expected:
            # The first step after idling (a request arrived): the native step's helper threads sleep, and
            # woken by the step itself they joined its first phases ~20-40 us late, on every prompt's TTFT.
            # Woken now, they wake while the Python below takes the inbox, schedules and builds the inputs.
            self.runner.expect_step(True)
        did_work = self._take_inbox()
        plan = self.scheduler.schedule()
        for seq in plan.cancelled:
            self._close(seq)
        if plan.is_empty:
            self._expect_step(False)
            return did_work or bool(plan.cancelled)
        num_tokens = self._postprocess(plan, self.runner.run(plan))
        self._steps += 1
        self._record(num_tokens)
        # A step follows at once while there is work: the native step's helper threads (asleep after a
        # short spin, shorter than this Python between two steps) are woken now rather than by the step.
        self._expect_step(self.has_work)
        return True

    def _expect_step(self, follows: bool) -> None:
        self.runner.expect_step(follows)
        self._step_expected = follows

    def _postprocess(self, plan: StepPlan, ran: RunResult) -> int:
        """What the plan's forwards produced goes out: each sampled token as text on its stream (or the end
        of its sequence), each probe's probability; then the scheduler records what was cached and
        finishes the sequences that ended. Returns how many tokens were added.

        A fault one request causes (its sampling settings: ``ran.failed``; its text: an error in
        ``outputs.append``) ends that request alone, with the error; the others go on. (A fault in
        the batched forward itself cannot be pinned on one request: the step loop ends the running
        ones, ``fail_running``.)"""
        finished: list[tuple[Sequence, str]] = []
        failed = list(ran.failed)
        added = 0
        for seq, probability in ran.probes:  # before the tokens: a probe inside a prompt is read first
            reason = self.outputs.probed(seq, probability)
            if reason is not None:
                finished.append((seq, reason))
        for seq, token in ran.tokens:
            try:
                reason = self.outputs.append(seq, token)
            except Exception as error:
                failed.append((seq, error))
                continue
            added += 1
            if reason is not None:
                finished.append((seq, reason))
        self.scheduler.postprocess(plan, finished)
        for seq, _ in finished:
            self._close(seq)
        for seq, error in failed:
            self._fail(seq, error)
        return added

    def _fail(self, seq: Sequence, error: BaseException) -> None:
        log.warning("request %d failed on the engine thread, alone: %r", seq.id, error)
        self.scheduler.finish(seq, "error")
        self._close(seq, error)

    def run_until_idle(self, max_steps: int | None = None) -> None:
        """Step until no request is left (for ``background=False`` use)."""
        steps = 0
        while self.has_work and (max_steps is None or steps < max_steps):
            if not self.step():
                return  # only held requests, or waiting ones they block
            steps += 1

    def _take_inbox(self) -> bool:
        """Applies what other threads handed in; returns whether there was anything."""
        arrived, cancels, holds, drops, prefixes = taken = self.inbox.take()
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
            if self.outputs.is_open(request_id):
                self.scheduler.cancel(request_id)
        for request_id, held in holds:
            self.scheduler.set_held(request_id, held)
        return any(taken)

    def _prefill_shared_prefix(self, ids: list[int]) -> None:
        prefix = self.kv_cache.reserve_prefix(ids)
        if prefix is None or prefix.is_ready:
            return
        chunk = self.config.prefill_chunk_tokens
        for start in range(0, len(ids), chunk):
            self.runner.prefill(prefix.row, ids[start: start + chunk], start, want_logits=False)
        self.kv_cache.mark_prefix_ready(prefix)
        self.num_prefix_prefills += 1

    def _close(self, seq: Sequence, error: BaseException | None = None) -> None:
        self.outputs.close(seq, error)
        self.sampler.forget(seq.id)

    def _record(self, new_tokens: int) -> None:
        now = time.perf_counter()
        self._tokens_generated += new_tokens
        self._recent.append((now, new_tokens))
        while self._recent and now - self._recent[0][0] > 5.0:
            self._recent.popleft()

    def fail_running(self, error: BaseException) -> None:
        """A batched forward failed: the sequences that were in it end with ``error``; the waiting
        ones were not in it and stay (the stepping thread goes on)."""
        log.exception("engine step failed; ending the %d running requests", len(self.scheduler.running))
        for seq in list(self.scheduler.running):
            self.scheduler.finish(seq, "error")
            self._close(seq, error)

    # ---- introspection ----
    def stats(self) -> EngineStats:
        recent = list(self._recent)
        span = recent[-1][0] - recent[0][0] if len(recent) > 1 else 0.0
        rate = sum(n for _, n in recent[1:]) / span if span > 0 else 0.0
        return EngineStats(waiting=len(self.scheduler.waiting) + self.inbox.num_sequences,
                           running=len(self.scheduler.running), slots_busy=self.kv_cache.num_busy,
                           slots_held=self.kv_cache.num_sessions, num_slots=len(self.kv_cache.slots),
                           tokens_generated=self._tokens_generated, tokens_per_s=rate, steps=self._steps)

    @property
    def num_open_requests(self) -> int:
        return len(self.outputs)

    def close(self) -> None:
        """Stop the loop; open requests end as cancelled."""
        self.inbox.close()
        if self._step_thread is not None:
            self._step_thread.join(timeout_s=10)
        arrived, _, _, drops, prefixes = self.inbox.take()
        for session, done in drops:
            self.kv_cache.drop_session(session)
            done.set()
        for _, done in prefixes:
            done.set()
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            self.scheduler.finish(seq, "cancelled")
            self._close(seq)
        for seq in arrived:
            seq.finish_reason = "cancelled"
            self._close(seq)
