"""Output handling, in one place: each new token of a sequence becomes text on its stream, and
here it is decided whether the sequence ends (an end-of-turn id, a stop string, its token limit).

The stepping thread alone calls ``append``/``close``; readers only see the ``TokenStream``.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from engine.detokenizer import IncrementalDetokenizer
from engine.sequence import Sequence
from engine.stop_strings import StopStringFilter
from engine.stream import TokenStream

log = logging.getLogger(__name__)

END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>")


def end_of_turn_ids(tokenizer, hf_config) -> set[int]:
    """Every id that ends an answer: the config's and tokenizer's EOS, and the chat templates'
    end-of-turn tokens the vocabulary has."""
    ids: set[int] = set()
    for value in (getattr(hf_config, "eos_token_id", None), tokenizer.eos_token_id):
        ids.update(value if isinstance(value, (list, tuple)) else [value] if value is not None else [])
    for token in END_OF_TURN_TOKENS:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
            ids.add(token_id)
    return ids


@dataclass
class _Output:
    """The output state of one sequence."""

    stream: TokenStream
    detokenizer: IncrementalDetokenizer
    stop_filter: StopStringFilter
    ignore_eos: bool = False  # benchmarks: always generate max_tokens


class OutputProcessor:
    """Token ids -> text deltas on each request's stream, and the reason a sequence finishes."""

    def __init__(self, tokenizer, eos_ids: set[int], max_seq_len: int, cancel: Callable[[int], None],
                 hold: Callable[[int, bool], None] | None = None):
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.max_seq_len = max_seq_len
        self._cancel = cancel  # what a stream's cancel() calls: the engine's, through its inbox
        self._hold = hold  # what a stream's hold() and release() call (LLMEngine.hold)
        self._outputs: dict[int, _Output] = {}

    def open(self, seq: Sequence, ignore_eos: bool = False) -> TokenStream:
        """The stream of a new request."""
        stream = TokenStream(seq.id, self._cancel, self._hold)
        stream.prompt_tokens = len(seq.prompt_ids)
        self._outputs[seq.id] = _Output(stream, IncrementalDetokenizer(self.tokenizer, seq.prompt_ids),
                                        StopStringFilter(seq.sampling.stop), ignore_eos)
        return stream

    def is_open(self, seq_id: int) -> bool:
        return seq_id in self._outputs

    def append(self, seq: Sequence, token: int) -> str | None:
        """One new token of ``seq``: its text goes out; returns the finish reason if it ends here."""
        output = self._outputs[seq.id]
        if seq.first_token_s is None:
            seq.first_token_s = time.perf_counter()
            output.stream.ttft_s = seq.ttft_s
            output.stream.first_token_at = seq.first_token_s
            output.stream.cached_tokens = seq.num_reused
        if token in self.eos_ids and not output.ignore_eos:
            reason = "stop"
        else:
            seq.output_ids.append(token)
            text, hit_stop = output.stop_filter.feed(output.detokenizer.add(token))
            if text:
                output.stream.put(text)
            too_long = len(seq.output_ids) >= seq.sampling.max_tokens or seq.num_tokens >= self.max_seq_len
            reason = "stop" if hit_stop else "length" if too_long else None
        # Text held back as a possible stop-string start is real output once the answer ends
        # (after a stop-string hit nothing is held).
        if reason is not None and (tail := output.stop_filter.flush()):
            output.stream.put(tail)
        return reason

    def probed(self, seq: Sequence, probability: float) -> str | None:
        """A probe's prompt is cached: its stream carries P(next token in probe_ids), no text, and
        ends ("probed"). A request probed inside its prompt (``probe_at``) goes on: None."""
        output = self._outputs[seq.id]
        output.stream.probe = probability
        output.stream.cached_tokens = seq.num_reused
        if seq.probe_at is None:
            return "probed"
        if output.stream.on_probe is not None:
            try:
                output.stream.on_probe(probability)
            except Exception:  # the consumer's fault: the answer goes on, stream.probe still holds the value
                log.warning("request %d: its on_probe callback raised", seq.id, exc_info=True)
        return None

    def close(self, seq: Sequence, error: BaseException | None = None) -> None:
        """The sequence is over (finished, cancelled or failed): end its stream."""
        output = self._outputs.pop(seq.id, None)
        if output is not None:
            output.stream.output_ids = list(seq.output_ids)
            output.stream.close(seq.finish_reason or "error", error)

    def __len__(self) -> int:
        return len(self._outputs)
