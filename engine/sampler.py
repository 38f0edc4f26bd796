"""``Sampler``: picks the next token of every sequence in a batch, each with its own settings.

Greedy batches (the common voice case at temperature 0) take one ``argmax``; otherwise each row gets
repetition penalty, DRY, temperature, top-k and top-p, and draws from its own seeded generator, so a
seeded request produces the same tokens whatever else shares its batch. fp32 rows on the CPU do this
with their penalties in numpy and the rest (temperature, top-k, the nucleus, one uniform draw against
the kept tokens' cumulative weights) in C where the fused kernels load (engine/sample_rows.cpp), else
in numpy by the same rule; not in torch's threaded ops.
"""
from __future__ import annotations

import ctypes
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from engine.sampling_params import SamplingParams
from engine.sequence import Sequence


def apply_repetition_penalty(logits: Tensor, seen_ids: list[int], penalty: float) -> Tensor:
    """HF's rule over prompt and output ids: positive logits / penalty, negative ones * penalty."""
    if penalty == 1.0 or not seen_ids:
        return logits
    ids = torch.tensor(sorted(set(seen_ids)))
    picked = logits[ids]
    logits[ids] = torch.where(picked > 0, picked / penalty, picked * penalty)
    return logits


def repetition_penalty_numpy(x: np.ndarray, seen_ids: list[int], penalty: float) -> None:
    """``apply_repetition_penalty`` on an fp32 numpy row in place (the same values: a logit / or * the
    penalty in fp32), without torch's tensor and indexing calls (~0.1 ms a token here)."""
    if penalty == 1.0 or not seen_ids:
        return
    ids = np.fromiter(set(seen_ids), dtype=np.int64)
    picked = x[ids]
    x[ids] = np.where(picked > 0, picked / np.float32(penalty), picked * np.float32(penalty))


DRY_WINDOW = 256  # output tokens DRY looks back over (llama.cpp's dry_penalty_last_n) ...
DRY_MAX_RUN = 64  # ... and the longest run it counts: a step costs at most 256 x 64 comparisons, and
# base ** (run - allowed_length) stays a finite float (a request may ask for 32k tokens of one loop)


def apply_dry_penalty(logits: Tensor, output_ids: list[int], p: SamplingParams) -> Tensor:
    """DRY over the last ``DRY_WINDOW`` output ids (SamplingParams.dry_*): for each earlier position
    i, the run of tokens ending at i that equals the run ending at the last token (its length L, at
    most ``DRY_MAX_RUN``), and the token that came after it then, ``ids[i + 1]``, which would repeat
    the run once more: that token loses ``multiplier * base ** (L - allowed_length)`` when
    L >= allowed_length (its longest run counts)."""
    if p.dry_multiplier == 0.0 or len(output_ids) < 2:
        return logits
    ids = output_ids[-DRY_WINDOW:]
    last = len(ids) - 1
    longest: dict[int, int] = {}
    for i in range(last):  # i < last: the token after i is in the window
        run = 0
        while run <= i and run < DRY_MAX_RUN and ids[i - run] == ids[last - run]:
            run += 1
        if run >= p.dry_allowed_length:
            following = ids[i + 1]
            longest[following] = max(longest.get(following, 0), run)
    for token, run in longest.items():
        logits[token] -= p.dry_multiplier * p.dry_base ** (run - p.dry_allowed_length)
    return logits


def filter_top_k_top_p(logits: Tensor, top_k: int, top_p: float) -> Tensor:
    """logits [V] with everything outside the top-k / nucleus set to -inf."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        # Drop a token when the tokens before it already reach top_p (the first is always kept); of equal
        # logits the first by index come first (a stable sort), as in nucleus_numpy. The sampled rows of
        # fp32 CPU logits take nucleus_numpy instead (Sampler._sample_row_numpy): this is the torch rule
        # for the others, and the reference the numpy one is tested against.
        sorted_logits, order = torch.sort(logits, descending=True, stable=True)
        probs = sorted_logits.softmax(-1)
        logits = logits.index_fill(0, order[(probs.cumsum(-1) - probs) >= top_p], float("-inf"))
    return logits


def nucleus_numpy(x: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """The ids (ascending) ``filter_top_k_top_p`` leaves finite in fp32 logits ``x`` [V], in numpy: the
    same rule (top-k's k-th value; of the logits in descending order, drop one when those before it
    already reach top_p of the mass; of equal logits at the edge the first by index). Only the logits
    within a factor 1e-4 (else 1e-8, else all) of the largest probability are ordered, when they hold
    top_p of the mass: every smaller one has at least that much before it, so it is dropped. The
    probabilities are fp32 exps, their sums in float64 (the same set as torch's fp32 arithmetic up to
    rounding: ties of the cumulative mass with top_p, far in a flat tail)."""
    V = len(x)
    pool = np.arange(V)
    if 0 < top_k < V:
        pool = np.flatnonzero(x >= np.partition(x, V - top_k)[V - top_k])  # >= the k-th largest
    if top_p >= 1.0:
        return pool
    xs = x[pool] if len(pool) < V else x
    e = np.exp(xs - xs.max())
    total = e.sum(dtype=np.float64)
    candidates = None
    for floor in (1e-4, 1e-8):
        candidates = np.flatnonzero(e >= floor)
        if e[candidates].sum(dtype=np.float64) >= top_p * total:
            break
    else:
        candidates = np.arange(len(xs))
    order = candidates[np.argsort(-xs[candidates], kind="stable")]  # descending, equal ones by index
    probs = e[order].astype(np.float64)
    cumulative = np.cumsum(probs)
    # kept: the places whose preceding mass is below top_p (the first always)
    n = max(int(np.searchsorted((cumulative - probs) / total, top_p, side="left")), 1)
    return pool[np.sort(order[:n])]


def probability_of(logits: Tensor, token_ids: frozenset[int]) -> float:
    """P(next token in ``token_ids``) from logits [V] (a probe request's answer)."""
    if not token_ids:
        return 0.0
    probs = logits.float().softmax(-1)
    return float(probs[torch.tensor(sorted(token_ids), dtype=torch.long)].sum())


def greedy_tokens(logits: Tensor) -> list[int]:
    """argmax of each row of logits [B, V] (the first of equal maxima, NaN above all, as torch's). fp32 on
    the CPU through numpy: torch's argmax took ~0.6 ms for 8 x 49,152 logits here against numpy's ~0.03
    (a batch-8 SmolLM2 decode step is ~10-20 ms)."""
    if logits.dtype == torch.float32 and logits.device.type == "cpu":
        return logits.numpy().argmax(-1).tolist()
    return logits.argmax(-1).tolist()


NativeRow = Callable[[int, int, float, int, float, float], int]  # (logits' address, V, temperature, top_k, top_p, u)


def native_sample_row(library_path) -> NativeRow | None:
    """``voxlane_sample_row`` from the fused kernels' library (engine/sample_rows.cpp: the temperature,
    top-k, nucleus and draw of one fp32 row by ``nucleus_numpy``'s rule) as a ctypes function, or None
    without the library (``Sampler`` then stays in numpy)."""
    if library_path is None:
        return None
    function = ctypes.CDLL(str(library_path)).voxlane_sample_row
    function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_int64, ctypes.c_double,
                         ctypes.c_double]
    function.restype = ctypes.c_int64
    return function


class Sampler:
    """Per-sequence sampling inside one batch; ``generators`` hold seeded RNG state by sequence id.
    ``native_row`` (``native_sample_row``, set where the kernels loaded): a sampled fp32 row's temperature,
    top-k, nucleus and draw in C, after its penalties in numpy."""

    def __init__(self, native_row: NativeRow | None = None):
        self.generators: dict[int, torch.Generator] = {}
        self.native_row = native_row

    def forget(self, seq_id: int) -> None:
        self.generators.pop(seq_id, None)

    @staticmethod
    def all_greedy(seqs: list[Sequence]) -> bool:
        """Whether every sequence takes its row's argmax (greedy, no penalties): then ``sample`` is
        ``greedy_tokens``."""
        return all(s.sampling.is_greedy and s.sampling.is_plain for s in seqs)

    def sample(self, logits: Tensor, seqs: list[Sequence]) -> list[int]:
        """logits [B, V] float32 -> one token id per sequence (row)."""
        if self.all_greedy(seqs):
            return greedy_tokens(logits)
        return [self._sample_row(logits[i], s) for i, s in enumerate(seqs)]

    def _generator(self, seq: Sequence) -> torch.Generator | None:
        """The sequence's seeded generator (made at its first draw), or None: torch's global one."""
        generator = self.generators.get(seq.id)
        if generator is None and seq.sampling.seed is not None:
            generator = self.generators[seq.id] = torch.Generator().manual_seed(seq.sampling.seed)
        return generator

    def _sample_row(self, logits: Tensor, seq: Sequence) -> int:
        if logits.dtype == torch.float32 and logits.device.type == "cpu":
            return self._sample_row_numpy(logits, seq)
        p = seq.sampling
        logits = apply_repetition_penalty(logits.clone(), seq.all_ids if p.repetition_penalty != 1.0 else [],
                                          p.repetition_penalty)
        logits = apply_dry_penalty(logits, seq.output_ids, p)
        if p.is_greedy:
            return int(logits.argmax())
        logits = filter_top_k_top_p(logits / p.temperature, p.top_k, p.top_p)
        probs = logits.softmax(-1)
        return int(torch.multinomial(probs, 1, generator=self._generator(seq)))

    def _sample_row_numpy(self, logits: Tensor, seq: Sequence) -> int:
        """``_sample_row`` for fp32 on the CPU, on one thread whatever torch's thread count: the penalties on
        a copy (numpy), then temperature, top-k, the nucleus, and one uniform draw (torch.rand from the
        sequence's generator) against the cumulative probabilities of the kept tokens only, by index: in
        C (``native_row``: ~0.08 ms a SmolLM2 row at a persona's settings) or numpy (~0.15 ms), the same
        tokens but where a cumulative mass lands within rounding of top_p or of the draw. The same
        distribution as softmax + ``torch.multinomial`` over the vocabulary, which cost ~1.6 ms on one
        thread and tens of ms on torch's two OpenMP threads under load; a seeded request's tokens differ
        from that draw's but are still fixed by its seed."""
        p = seq.sampling
        x = logits.numpy().copy()
        if p.repetition_penalty != 1.0:
            repetition_penalty_numpy(x, seq.all_ids, p.repetition_penalty)
        if p.dry_multiplier != 0.0:
            apply_dry_penalty(torch.from_numpy(x), seq.output_ids, p)  # writes into x through the view
        if p.is_greedy:
            return int(x.argmax())
        u = float(torch.rand((), dtype=torch.float64, generator=self._generator(seq)))
        if self.native_row is not None:
            token = self.native_row(x.ctypes.data, len(x), p.temperature, p.top_k, p.top_p, u)
            if token < 0:
                raise ValueError(f"sampling: temperature {p.temperature} is not a positive number")
            return token
        x /= np.float32(p.temperature)
        kept = nucleus_numpy(x, p.top_k, p.top_p)  # token ids, ascending
        top = x[kept].max()
        weights = np.exp((x[kept] - top).astype(np.float64))
        cumulative = np.cumsum(weights)
        return int(kept[min(int(np.searchsorted(cumulative, u * cumulative[-1], side="right")), len(kept) - 1)])
