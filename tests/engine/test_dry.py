"""DRY ("don't repeat yourself", SamplingParams.dry_*): a token that would continue a run of the
answer's own earlier tokens loses logit, growing with the run; over the output only. Scripted ids,
the sampler's paths, the transformers reference's processor, and the packaged Qwen2.5-0.5B's real
loop on a greedy spoken answer (it lists "sunglasses" until max_tokens without it)."""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from engine.backends.reference import _DryPenalty
from engine.sampler import Sampler, apply_dry_penalty
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

DRY = SamplingParams(temperature=0.0, dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2)
LOOP = re.compile(r"\b(\w+(?:\W+\w+){0,3}?)(?:\W+\1\b){3}")  # bench answers' check: a unit said 4 times running


def test_the_token_that_would_repeat_a_run_loses_more_the_longer_the_run():
    # 5 6 7 5 6 7 5 6: the run "5 6" ended at 1 (then came 7), "7 5 6 ... 5 6" (5 long) at 4 (then 7):
    # 7 loses 0.8 * 1.75 ** (5 - 2); nothing else is touched.
    penalized = apply_dry_penalty(torch.zeros(10), [5, 6, 7, 5, 6, 7, 5, 6], DRY)
    expected = torch.zeros(10)
    expected[7] = -0.8 * 1.75 ** 3
    assert torch.allclose(penalized, expected)
    # A word used twice, or a run shorter than allowed_length, costs nothing.
    assert not apply_dry_penalty(torch.zeros(10), [1, 2, 3, 1], DRY).any()
    assert not apply_dry_penalty(torch.zeros(10), [1, 2, 3, 1, 2], dataclasses.replace(DRY, dry_allowed_length=3)).any()
    assert apply_dry_penalty(torch.zeros(10), [1, 2, 3, 1, 2], DRY)[3] == pytest.approx(-0.8)
    assert not apply_dry_penalty(torch.zeros(10), [5, 6, 7, 5, 6], SamplingParams()).any()  # off by default


def test_a_long_loop_costs_a_bounded_step_and_a_finite_penalty():
    """A request may ask for 32k tokens of one token repeated: the look-back is DRY_WINDOW tokens and
    a run counts up to DRY_MAX_RUN, so the step stays cheap and base ** run finite."""
    from engine.sampler import DRY_MAX_RUN

    strong = dataclasses.replace(DRY, dry_base=4.0)
    penalized = apply_dry_penalty(torch.zeros(10), [3] * 30000, strong)
    assert penalized[3] == pytest.approx(-0.8 * 4.0 ** (DRY_MAX_RUN - 2)) and torch.isfinite(penalized).all()
    assert not penalized[torch.arange(10) != 3].any()


def test_the_sampler_applies_it_to_the_output_not_the_prompt():
    logits = torch.zeros(1, 10)
    logits[0, 7], logits[0, 8] = 1.5, 1.0  # the model wants 7 (the loop), then 8
    looping = Sequence(1, [5, 6, 7, 5, 6, 7], DRY)  # the same run in the prompt: free ("Repeat after me")
    assert Sampler().sample(logits, [looping]) == [7]
    looping.output_ids = [5, 6, 7, 5, 6]  # 7 would go on repeating "5 6 7": -0.8 * 1.75 ** 0
    assert Sampler().sample(logits, [looping]) == [8]
    plain = Sequence(2, [1], SamplingParams(temperature=0.0))
    plain.output_ids = [5, 6, 7, 5, 6]
    assert Sampler().sample(logits.repeat(2, 1), [looping, plain]) == [8, 7]  # per row, in one batch


def test_the_reference_backend_penalizes_the_same_way():
    prompt, output = [1, 2, 5, 6, 7], [5, 6, 7, 5, 6]
    scores = torch.zeros(1, 10)
    _DryPenalty(DRY, len(prompt))(torch.tensor([prompt + output]), scores)
    assert torch.equal(scores[0], apply_dry_penalty(torch.zeros(10), output, DRY))


def test_settings_are_checked():
    for bad in ({"dry_multiplier": -1}, {"dry_multiplier": 6}, {"dry_base": 0.5}, {"dry_allowed_length": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(**bad)


def test_the_packaged_qwen_no_longer_loops_on_a_list(qwen05_dir):
    from engine.backends.engine_backend import EngineBackend
    from engine.config import EngineConfig
    from pipeline.persona.store import PersonaStore

    nova = PersonaStore().get("nova")
    messages = [{"role": "system", "content": nova.full_system_prompt()},
                {"role": "user", "content": "What should I pack for a day at the beach?"}]
    greedy = dataclasses.replace(nova.sampling, temperature=0.0, max_tokens=60)
    assert greedy.dry_multiplier > 0  # the shipped persona has it on
    backend = EngineBackend(qwen05_dir, EngineConfig(quant="native", int8_activations=True, max_seq_len=512,
                                                     num_slots=2, max_batch_size=2))
    try:
        without = "".join(backend.generate(messages, dataclasses.replace(greedy, dry_multiplier=0.0)))
        with_dry = "".join(backend.generate(messages, greedy))
    finally:
        backend.close()
    assert LOOP.search(without), without  # the loop this guards against ("sunglasses, sunglasses, ...")
    assert not LOOP.search(with_dry) and "sunscreen" in with_dry.lower(), with_dry
