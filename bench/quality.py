"""Quantization quality on a fixed prompt set: greedy top-1 agreement and next-token KL vs fp32.

The fp32 model writes a greedy continuation of each prompt; then both models read the same
prompt + continuation (teacher forcing) and we compare their next-token distributions at every
generated position: top-1 agreement (the fraction of positions where both pick the same greedy
token) and mean KL(p_fp32 || p_test). ``first_token_same`` says whether the very first answer token
matches, which is where ``quantize_dynamic`` already fails on SmolLM2.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.model import Transformer

QUALITY_PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain why the sky is blue in two sentences.",
    "Give me three tips for sleeping better.",
    "What should I cook tonight with eggs and spinach?",
)


@dataclass
class QualityReport:
    """Agreement of a model with the fp32 reference over ``num_positions`` generated positions."""

    top1_agreement: float
    mean_kl: float
    first_token_same: float  # fraction of prompts whose first answer token matches
    num_positions: int


def engine_kv_dtype(model: Transformer) -> torch.dtype:
    """The KV cache's dtype the engine gives ``model`` by default (``kv_cache_dtype = "auto"``): fp16 where
    the one-call step runs, else the activations' dtype."""
    from engine import native_step
    from engine.config import EngineConfig

    config = EngineConfig(dtype=str(model.norm.weight.dtype).removeprefix("torch."))  # the model's activations
    return config.kv_torch_dtype(native_step.supports_model(model))


def one_slot_runner(model: Transformer, num_positions: int, kv_dtype: torch.dtype | None = None):
    """A ``ModelRunner`` of ``model`` over a private KV cache of one slot and ``num_positions`` (of
    ``kv_dtype``; None: the engine's default for the model)."""
    from engine.kv_cache import KVCache
    from engine.runner import ModelRunner

    return ModelRunner(model, KVCache(model.args, 1, num_positions, kv_dtype or engine_kv_dtype(model)))


@torch.inference_mode()
def greedy_continuation(model: Transformer, ids: list[int], num_tokens: int,
                        stop_ids: set[int]) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens of ``model`` after ``ids``, through a private one-slot KV cache, with the
    log-softmax of the logits that chose each token and of the logits after the last one ->
    (tokens, [len(tokens) + 1, V]): the rows ``next_token_logprobs`` gives for ids + tokens."""
    runner = one_slot_runner(model, len(ids) + num_tokens + 1)
    rows = [runner.prefill(0, ids, 0)]
    out: list[int] = []
    while len(out) < num_tokens and (token := int(rows[-1].argmax())) not in stop_ids:
        out.append(token)
        rows.append(runner.decode([0], [token], [len(ids) + len(out) - 1])[0])
    return out, torch.stack(rows).log_softmax(-1)


@torch.inference_mode()
def next_token_logprobs(model: Transformer, ids: list[int], first: int, kv_dtype: torch.dtype | None = None) -> torch.Tensor:
    """log-softmax of the model's next-token logits at positions first-1 .. len(ids)-1 -> [n, V],
    computed the way generation computes them: the prompt ids[:first] as one prefill, then each
    later token as a decode step (so the int8 decode path, not only its prefill, is measured)."""
    runner = one_slot_runner(model, len(ids) + 1, kv_dtype)
    rows = [runner.prefill(0, ids[:first], 0)]
    for position in range(first, len(ids)):
        rows.append(runner.decode([0], [ids[position]], [position])[0])
    return torch.stack(rows).log_softmax(-1)


def compare(reference: Transformer, candidate, encoded_prompts: list[list[int]], num_tokens: int,
            stop_ids: set[int], kv_dtype: torch.dtype | None = None) -> QualityReport:
    """``candidate`` is a Transformer (its KV cache ``kv_dtype``, None: the engine's default for it) or a
    callable(ids) -> logits [T, V] (e.g. a transformers model). The reference runs over an fp32 cache."""
    agree = kl_sum = first_same = positions = 0.0
    for prompt in encoded_prompts:
        continuation, ref = greedy_continuation(reference, prompt, num_tokens, stop_ids)  # ref [n+1, V]
        ids = prompt + continuation
        if isinstance(candidate, Transformer):
            test = next_token_logprobs(candidate, ids, len(prompt), kv_dtype)
        else:
            with torch.inference_mode():
                test = candidate(ids)[len(prompt) - 1:].float().log_softmax(-1)
        same = ref.argmax(-1) == test.argmax(-1)
        agree += same.sum().item()
        first_same += float(same[0])
        kl_sum += (ref.exp() * (ref - test)).sum(-1).sum().item()
        positions += ref.shape[0]
    return QualityReport(agree / positions, kl_sum / positions, first_same / len(encoded_prompts), int(positions))
