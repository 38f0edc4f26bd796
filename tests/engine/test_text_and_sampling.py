"""UTF-8 safety of deltas, and per-sequence sampling."""
from __future__ import annotations

import asyncio

import pytest
import torch

from engine.detokenizer import IncrementalDetokenizer
import numpy as np

from engine import kernels
from engine.sampler import (Sampler, apply_repetition_penalty, filter_top_k_top_p, greedy_tokens, native_sample_row,
                            nucleus_numpy, repetition_penalty_numpy)
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

TRICKY = "Café déjà vu — naïve 東京 🚀🎉 voilà! Ünïcödé ✓ 𝄞 end."


def test_deltas_are_whole_characters_and_add_up(fp32_engine):
    tokenizer = fp32_engine.tokenizer
    ids = tokenizer.encode(TRICKY, add_special_tokens=False)
    # the emoji and CJK characters really are split over several byte-level tokens
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)
    detok = IncrementalDetokenizer(tokenizer, [1, 4093, 198])
    deltas = [detok.add(i) for i in ids]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == TRICKY
    for d in deltas:
        d.encode("utf-8")  # valid text: no lone surrogates


def test_engine_stream_of_forced_multibyte_tokens_is_utf8_safe(fp32_engine):
    """The model is asked to repeat emoji-laden text; whatever it says, every delta is whole text."""
    engine = fp32_engine
    stream = engine.submit([{"role": "user", "content": f"Repeat exactly: {TRICKY}"}],
                           SamplingParams(temperature=0.0, max_tokens=40))
    engine.run_until_idle()
    deltas = list(stream)
    assert deltas and all("\ufffd" not in d for d in deltas)
    # A generation cut by max_tokens inside a character withholds the incomplete bytes.
    assert "".join(deltas) == engine.tokenizer.decode(stream.output_ids, skip_special_tokens=True).rstrip("\ufffd")


def test_async_iteration(fp32_engine):
    engine = fp32_engine
    stream = engine.submit([{"role": "user", "content": "Say hello."}], SamplingParams(temperature=0, max_tokens=5))
    engine.run_until_idle()

    async def collect():
        return [d async for d in stream]

    assert "".join(asyncio.run(collect())) == engine.tokenizer.decode(stream.output_ids, skip_special_tokens=True)


def test_top_k_and_top_p_filters():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    assert torch.isinf(filter_top_k_top_p(logits.clone(), 2, 1.0)[2:]).all()
    assert not torch.isinf(filter_top_k_top_p(logits.clone(), 2, 1.0)[:2]).any()
    probs = logits.softmax(-1)  # [0.64, 0.24, 0.09, ...]: top_p 0.8 keeps the first two
    kept = ~torch.isinf(filter_top_k_top_p(logits.clone(), 0, 0.8))
    assert kept.tolist() == [True, True, False, False, False] and probs[:2].sum() > 0.8


def test_the_nucleus_keeps_the_first_of_equal_logits_at_its_edge():
    """Of equal logits at the nucleus's edge the first by index stay (the rule nucleus_numpy keeps too)."""
    ties = torch.tensor([1.0, 3.0, 2.0, 3.0, 3.0, 0.0])  # probabilities ~[.04, .30, .11, .30, .30, .02]
    assert torch.isinf(filter_top_k_top_p(ties, 0, 0.5)).tolist() == [True, False, True, False, True, True]
    assert torch.isinf(filter_top_k_top_p(ties.flip(0), 0, 0.5)).tolist() == [True, False, False, True, True, True]


def _nucleus_in_float64(x: torch.Tensor, top_k: int, top_p: float) -> list[int]:
    """The top-k / top-p rule over a float64 sort of every logit (ties by index), as ascending ids."""
    x = x.double().numpy()
    order = np.argsort(-x, kind="stable")
    if 0 < top_k < len(x):
        order = order[x[order] >= x[order[top_k - 1]]]
    probs = np.exp(x[order] - x[order[0]])
    preceding = (np.cumsum(probs) - probs) / probs.sum()
    return sorted(order[:max(int((preceding < top_p).sum()), 1)].tolist())


def _logit_rows():
    """(x, scale, top_k, top_p): 49,152 / 1,000 / 37 / 2 seeded logits, flat to peaked (scale 0.3-10),
    without and with ties (halves), under top_p 0.01-1 and top_k 0-40."""
    g = torch.Generator().manual_seed(1)
    for V in (49152, 1000, 37, 2):
        for scale in (0.3, 3.0, 10.0):
            for top_p in (0.01, 0.5, 0.9, 0.95, 1.0):
                for top_k in (0, 1, 5, 40):
                    for ties in (False, True):
                        x = torch.randn(V, generator=g) * scale
                        yield ((x * 2).round() / 2 if ties else x), scale, top_k, top_p


def test_the_numpy_nucleus_is_the_torch_filters():
    """The sampled row's kept tokens (nucleus_numpy: fp32 exps, float64 sums, only the logits within
    1e-4 / 1e-8 of the top ordered when they hold top_p) are the set of a float64 sort of every logit, and
    the ones filter_top_k_top_p leaves finite: top-k, top-p, both, ties at the edge. Over a flat 49k
    vocabulary torch's fp32 cumulative sum moves the edge by a token or two (4 of these 240 cases, where
    the float64 sort agrees with nucleus_numpy): those are compared with the float64 sort only."""
    for x, scale, top_k, top_p in _logit_rows():
        got = nucleus_numpy(x.numpy().copy(), top_k, top_p).tolist()
        if top_p < 1.0:
            assert got == _nucleus_in_float64(x, top_k, top_p)
        if len(x) < 49152 or scale == 10.0 or top_p < 0.9:
            want = torch.isfinite(filter_top_k_top_p(x.clone(), top_k, top_p)).nonzero().flatten()
            assert got == want.tolist()


@pytest.fixture(scope="module")
def native_row():
    """The fused kernels' C draw (engine/sample_rows.cpp), as the engine's Sampler gets it."""
    if kernels.load_kernels() is None:
        pytest.skip(f"the fused kernels do not build here: {kernels.unavailable_reason()}")
    row = native_sample_row(kernels.library_path())
    assert row is not None
    return row


def test_the_native_draw_is_the_numpy_draw(native_row):
    """The C draw (temperature, top-k, nucleus, one uniform against the kept tokens' cumulative weights)
    picks numpy's token for the same seeded uniform: 49,152 / 1,000 / 37 / 2 logits, flat to peaked, top_p
    0.01-1, top_k 0-40, ties at the edge, two temperatures, five draws each (960 rows here, none
    differing; the rule allows a difference only where a cumulative mass lands within rounding of top_p or
    of the draw)."""
    seed = 0
    for x, scale, top_k, top_p in _logit_rows():
        for temperature in (0.7, 1.0):
            seed += 1
            sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
            numpy_sampler, native_sampler = Sampler(), Sampler(native_row)
            a, b = Sequence(1, [1], sampling), Sequence(1, [1], sampling)
            want = [numpy_sampler.sample(x[None], [a])[0] for _ in range(5)]
            got = [native_sampler.sample(x[None], [b])[0] for _ in range(5)]
            assert got == want, (len(x), scale, top_p, top_k, temperature, seed)


def test_the_native_draw_never_takes_a_masked_logit(native_row):
    """-inf logits weigh nothing in the C draw (fast_exp's floor is not a weight): 2,000 draws over a
    49,152-logit row with all but 3 masked, without top-p and with it; a temperature that is not a
    positive number is an error, not a token."""
    x = torch.full((49152,), float("-inf"))
    x[[7, 20000, 49151]] = torch.tensor([0.5, 0.0, -0.5])
    for top_p in (1.0, 0.99):
        sampler = Sampler(native_row)
        seq = Sequence(1, [1], SamplingParams(temperature=1.0, top_p=top_p, seed=3))
        assert {sampler.sample(x[None], [seq])[0] for _ in range(2000)} == {7, 20000, 49151}
    assert native_row(x.numpy().ctypes.data, 49152, float("nan"), 0, 1.0, 0.5) == -1
    assert native_row(x.numpy().ctypes.data, 49152, -1.0, 0, 1.0, 0.5) == -1


@pytest.mark.parametrize("native", [False, True], ids=["numpy", "native"])
def test_a_sampled_row_draws_from_the_nucleus_without_torch_multinomial(monkeypatch, native, request):
    """temperature 0.7, top_p 0.9 (the personas' default) on fp32 CPU logits: the nucleus and one uniform
    draw (numpy's, or the C one where the kernels load), no torch.multinomial / softmax / sort over the
    vocabulary (tens of ms on torch's two threads under load). The draw's frequencies are the nucleus's
    renormalized probabilities (20,000 seeded draws: every token within 4.5 sigma, nothing outside the
    nucleus); the same seed gives the same tokens."""
    row = request.getfixturevalue("native_row") if native else None
    for name in ("multinomial", "softmax", "sort"):
        monkeypatch.setattr(torch, name, lambda *a, _name=name, **k: pytest.fail(f"torch.{_name} was called"))
    monkeypatch.setattr(torch.Tensor, "softmax", lambda *a, **k: pytest.fail("Tensor.softmax was called"))
    logits = torch.tensor([2.0, 1.5, 1.4, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0, -3.0, 1.4, 0.2])
    scaled = (logits / 0.7).double()
    probs = (scaled - scaled.max()).exp() / (scaled - scaled.max()).exp().sum()
    order = sorted(range(len(probs)), key=lambda i: (-float(probs[i]), i))
    nucleus, mass = [], 0.0
    for i in order:
        if mass >= 0.9:
            break
        nucleus.append(i)
        mass += float(probs[i])
    assert 3 < len(nucleus) < len(logits) - 2  # the nucleus really drops some tokens
    expected = np.zeros(len(logits))
    expected[nucleus] = probs[nucleus].numpy() / probs[nucleus].sum().item()
    sampler, draws = Sampler(row), 20000
    seq = Sequence(1, [1], SamplingParams(temperature=0.7, top_p=0.9, seed=11))
    tokens = [sampler.sample(logits[None], [seq])[0] for _ in range(draws)]
    counts = np.bincount(tokens, minlength=len(logits))
    assert counts[[i for i in range(len(logits)) if i not in nucleus]].sum() == 0
    sigma = np.sqrt(draws * expected * (1 - expected))
    assert np.all(np.abs(counts - draws * expected) <= 4.5 * sigma + 1e-9), (counts, draws * expected)
    again = Sampler(row)
    assert [again.sample(logits[None], [seq])[0] for _ in range(200)] == tokens[:200]


def test_greedy_tokens_are_torch_argmax():
    """The greedy batch path (numpy's argmax for fp32 on the CPU) picks what torch's argmax picks: the
    first of equal maxima, NaN above everything, -inf rows, rows of a non-contiguous view, bf16."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(8, 49152, generator=g)
    logits[1, 7] = logits[1, 9] = logits[1].max() + 1  # a tie: the first
    logits[2, 40000] = float("nan")
    logits[3] = float("-inf")
    logits[4, 5] = float("inf")
    logits[5, 100] = logits[5, 50] = float("nan")  # NaNs: the first
    for case in (logits, logits[::2], logits[:, 1000:], logits.T.contiguous().T, logits.bfloat16()):
        assert greedy_tokens(case) == case.argmax(-1).tolist()
    seqs = [Sequence(i, [1, 2], SamplingParams(temperature=0.0)) for i in range(8)]
    assert Sampler().sample(logits, seqs) == logits.argmax(-1).tolist()


def test_repetition_penalty_follows_hf_rule():
    logits = torch.tensor([2.0, -2.0, 1.0])
    out = apply_repetition_penalty(logits.clone(), [0, 1], 2.0)
    assert out.tolist() == [1.0, -4.0, 1.0]


def test_the_numpy_repetition_penalty_is_the_torch_rule_bit_for_bit():
    """The sampled rows' penalty (numpy, in place) gives apply_repetition_penalty's values exactly: positive,
    negative and zero logits, repeated ids, penalties above and below 1; no ids or a penalty of 1: unchanged."""
    g = torch.Generator().manual_seed(7)
    for penalty in (1.1, 1.3, 0.9, 2.0):
        logits = torch.randn(49152, generator=g) * 5
        logits[:10] = 0.0
        seen = torch.randint(0, 49152, (400,), generator=g).tolist() + list(range(12)) + [3, 3, 3]
        x = logits.numpy().copy()
        repetition_penalty_numpy(x, seen, penalty)
        assert torch.equal(torch.from_numpy(x), apply_repetition_penalty(logits.clone(), seen, penalty)), penalty
        assert not np.array_equal(x, logits.numpy())
    x = logits.numpy().copy()
    repetition_penalty_numpy(x, [], 1.3)
    repetition_penalty_numpy(x, [1, 2], 1.0)
    assert np.array_equal(x, logits.numpy())


def test_seeded_sampling_is_reproducible_per_sequence_in_a_batch():
    sampler = Sampler()
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    seeded = SamplingParams(temperature=1.0, top_p=1.0, seed=7)
    other = SamplingParams(temperature=1.0, top_p=1.0)
    greedy = SamplingParams(temperature=0.0)
    alone = sampler.sample(logits[:1], [Sequence(100, [1], seeded)])
    first_in_batch = sampler.sample(logits, [Sequence(200, [1], seeded), Sequence(201, [1], other),
                                             Sequence(202, [1], greedy)])
    assert first_in_batch[0] == alone[0]
    assert first_in_batch[2] == int(logits[2].argmax())


def test_seeded_generation_reproducible_and_batch_independent(int8_engine):
    """A seeded sampled request gives the same tokens alone and beside another; where the kernels load the
    engine's sampler draws in C (engine/sample_rows.cpp), and its tokens are the numpy sampler's."""
    engine = int8_engine
    assert (engine.sampler.native_row is not None) == (engine.model.kernels is not None)
    prompt = [{"role": "user", "content": "Tell me a short story."}]
    sampling = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, repetition_penalty=1.1, max_tokens=10, seed=123)
    a = engine.submit(prompt, sampling)
    engine.run_until_idle()
    b = engine.submit(prompt, sampling)
    noise = engine.submit([{"role": "user", "content": "Something else."}], SamplingParams(temperature=1.0, max_tokens=10))
    engine.run_until_idle()
    assert a.output_ids == b.output_ids and len(a.output_ids) == 10
    assert noise.finish_reason in ("length", "stop")
    native, engine.sampler.native_row = engine.sampler.native_row, None
    try:
        c = engine.submit(prompt, sampling)
        engine.run_until_idle()
    finally:
        engine.sampler.native_row = native
    assert c.output_ids == a.output_ids
