"""The transformers reference backend: ``model.generate`` with a streamer on a worker thread.

It stays as the yardstick our engine is checked (logits, greedy tokens) and benchmarked against.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Iterator

from engine.backends.base import Message
from engine.loader import chat_prompt_ids
from engine.sampling_params import SamplingParams
from engine.stop_strings import StopStringFilter


class _CancelCriteria:
    """A transformers StoppingCriteria that ends generation when a flag is set."""

    def __init__(self, cancelled: threading.Event):
        self.cancelled = cancelled

    def __call__(self, input_ids, scores, **kwargs) -> bool:
        return self.cancelled.is_set()


class _DryPenalty:
    """Our engine's DRY penalty (engine.sampler.apply_dry_penalty) as a transformers logits processor:
    input_ids [1, prompt + output], scores [1, V]; over the output ids only, as in the engine."""

    def __init__(self, sampling: SamplingParams, prompt_length: int):
        self.sampling, self.prompt_length = sampling, prompt_length

    def __call__(self, input_ids, scores):
        from engine.sampler import apply_dry_penalty

        apply_dry_penalty(scores[0], input_ids[0, self.prompt_length:].tolist(), self.sampling)
        return scores


class ReferenceCompletion:
    """A streaming answer from ``generate`` running on its own thread."""

    def __init__(self, backend: "TransformersBackend", messages: list[Message], sampling: SamplingParams):
        import torch
        from transformers import StoppingCriteriaList, TextIteratorStreamer

        self._cancelled = threading.Event()
        self._stop = StopStringFilter(sampling.stop)
        tok = backend.tokenizer
        ids = backend.encode(messages)
        self._streamer = TextIteratorStreamer(tok, skip_prompt=True, skip_special_tokens=True)
        kwargs = dict(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=sampling.max_tokens,
            streamer=self._streamer,
            stopping_criteria=StoppingCriteriaList([_CancelCriteria(self._cancelled)]),
            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
            repetition_penalty=sampling.repetition_penalty,
        )
        if sampling.dry_multiplier:
            from transformers import LogitsProcessorList

            kwargs.update(logits_processor=LogitsProcessorList([_DryPenalty(sampling, len(ids))]))
        if sampling.is_greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p,
                          top_k=sampling.top_k or None)
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
        self._thread = threading.Thread(target=self._run, args=(backend, kwargs), daemon=True,
                                        name="reference-generate")
        self._error: BaseException | None = None
        self._thread.start()

    def _run(self, backend: "TransformersBackend", kwargs: dict) -> None:
        import torch

        try:
            with backend.lock, torch.inference_mode():
                backend.model.generate(**kwargs)
        except BaseException as error:  # surfaced to the reader, never lost on the thread
            self._error = error
            self._streamer.end()

    def __iter__(self) -> Iterator[str]:
        for piece in self._streamer:
            if self._cancelled.is_set():
                break
            text, done = self._stop.feed(piece)
            if text:
                yield text
            if done:
                self.cancel()
                break
        else:
            if tail := self._stop.flush():
                yield tail
        self._thread.join()
        if self._error is not None:
            raise self._error

    def cancel(self) -> None:
        self._cancelled.set()


class TransformersBackend:
    """LLM backend on transformers ``AutoModelForCausalLM`` (fp32, CPU)."""

    name = "transformers"

    def __init__(self, model_dir: str | Path, num_threads: int | None = None, dtype: str = "float32"):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a progress bar per load is noise in a chat or a server log
        if num_threads:
            torch.set_num_threads(num_threads)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
        self.lock = threading.Lock()  # one generate() at a time: this backend does not batch

    def encode(self, messages: list[Message]) -> list[int]:
        return chat_prompt_ids(self.tokenizer, messages)

    def count_tokens(self, messages: list[Message]) -> int:
        return len(self.encode(messages))

    @property
    def context_length(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))

    def generate(self, messages: list[Message], sampling: SamplingParams, session: str | None = None) -> ReferenceCompletion:
        return ReferenceCompletion(self, messages, sampling)

    def close(self) -> None:
        pass
