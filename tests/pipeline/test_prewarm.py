"""The system-prompt prewarm on our engine: when a session starts, its LLM stage has the persona's
system prompt prefilled (into a shared row of the engine's KV cache, copied into the session's slot),
so its first turn computes only the tokens after it (``llm.is_prewarm_enabled``)."""
from __future__ import annotations

import dataclasses
import time

import pytest

from pipeline.config import LLMStageConfig, PipelineConfig
from pipeline.frames import TurnDone
from pipeline.persona.store import PersonaStore
from pipeline.pipeline import Pipeline
from tests.pipeline.fakes import SilentTTS

pytestmark = pytest.mark.slow


class StreamsKept:
    """The engine backend, keeping each generation it hands out (to read its cache figures)."""

    def __init__(self, backend):
        self.backend, self.generations = backend, []

    def generate(self, messages, sampling, session=None):
        return self._kept(messages, self.backend.generate(messages, sampling, session))

    def generate_held(self, messages, sampling, session, hold_after):
        return self._kept(messages, self.backend.generate_held(messages, sampling, session, hold_after))

    def _kept(self, messages, generation):
        self.generations.append((messages, generation))
        return generation

    def __getattr__(self, name):
        return getattr(self.backend, name)


def first_turn(engine_llm, session: str, is_prewarm_enabled: bool, system_prefix: str = ""):
    """(the first turn's generation, the system prompt's length in tokens). The stage prewarms on
    its own thread before it takes any frame, so the first turn always comes after the prewarm."""
    llm = StreamsKept(engine_llm)
    nova = PersonaStore().get("nova")
    persona = dataclasses.replace(nova, system_prompt=system_prefix + nova.system_prompt,
                                  sampling=dataclasses.replace(nova.sampling, temperature=0.0, max_tokens=8))
    config = PipelineConfig(llm=LLMStageConfig(is_prewarm_enabled=is_prewarm_enabled))
    tts = SilentTTS()
    with Pipeline(llm=llm, tts=lambda voice: tts, personas=persona, config=config, session=session) as pipeline:
        gen = pipeline.text_input("What is the capital of France?")
        deadline = time.monotonic() + 300
        while not isinstance(frame := pipeline.next_frame(1.0), TurnDone) or frame.gen != gen:
            assert time.monotonic() < deadline, "the turn never ended"
    system = engine_llm.count_tokens([{"role": "system", "content": persona.full_system_prompt()}])
    turn = next(g for messages, g in llm.generations if messages[-1]["content"].startswith("What is"))
    return turn, system


def test_the_system_prompt_is_prefilled_when_the_session_starts(engine_llm):
    turn, system = first_turn(engine_llm, "prewarm-on", is_prewarm_enabled=True)
    print(f"\nprewarmed: first turn {turn.prompt_tokens} prompt tokens, {turn.cached_tokens} found "
          f"cached (system prompt {system})")
    assert turn.cached_tokens > 0.8 * system  # the system prompt was not computed again
    # Without it the first turn prefills everything (a prompt of its own: the engine keeps shared
    # rows of earlier prompts, and only the template's first tokens are common).
    cold, system = first_turn(engine_llm, "prewarm-off", is_prewarm_enabled=False, system_prefix="Prewarm is off. ")
    print(f"not prewarmed: {cold.cached_tokens} of {cold.prompt_tokens} found cached")
    assert cold.cached_tokens < 0.2 * system
