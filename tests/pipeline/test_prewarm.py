"""The system-prompt prewarm on our engine: a session's LLM stage prefills the persona's system
prompt into the session's KV slot when the session starts, so its first turn computes only the
tokens after it (``llm.is_prewarm_enabled``)."""
from __future__ import annotations

import dataclasses
import time

import pytest

from pipeline.config import LLMStageConfig, PipelineConfig
from pipeline.frames import TurnDone
from pipeline.persona_store import PersonaStore
from pipeline.pipeline import Pipeline
from tests.pipeline.fakes import SilentTTS

pytestmark = pytest.mark.slow


class StreamsKept:
    """The engine backend, keeping each generation it hands out (to read its cache figures)."""

    def __init__(self, backend):
        self.backend, self.generations = backend, []

    def generate(self, messages, sampling, session=None):
        self.generations.append((messages, self.backend.generate(messages, sampling, session)))
        return self.generations[-1][1]

    def __getattr__(self, name):
        return getattr(self.backend, name)


def first_turn(engine_llm, session: str, is_prewarm_enabled: bool):
    """(held slots once the session is open, the first turn's generation, the system prompt's tokens)."""
    llm = StreamsKept(engine_llm)
    store = PersonaStore()
    nova = store.get("nova")
    persona = dataclasses.replace(nova, sampling=dataclasses.replace(nova.sampling, temperature=0.0, max_tokens=8))
    config = PipelineConfig(llm=LLMStageConfig(is_prewarm_enabled=is_prewarm_enabled))
    tts = SilentTTS()
    held_before = engine_llm.stats().slots_held
    with Pipeline(llm=llm, tts=lambda voice: tts, personas=persona, config=config, session=session) as pipeline:
        deadline = time.monotonic() + 60
        while is_prewarm_enabled and engine_llm.stats().slots_held == held_before and time.monotonic() < deadline:
            time.sleep(0.02)  # the stage's setup runs on its thread
        held = engine_llm.stats().slots_held - held_before
        gen = pipeline.text_input("What is the capital of France?")
        deadline = time.monotonic() + 180
        while not isinstance(frame := pipeline.next_frame(1.0), TurnDone) or frame.gen != gen:
            assert time.monotonic() < deadline, "the turn never ended"
    system = engine_llm.count_tokens([{"role": "system", "content": persona.full_system_prompt()}])
    turn = next(g for messages, g in llm.generations if messages[-1]["content"].startswith("What is"))
    return held, turn, system


def test_the_system_prompt_is_prefilled_when_the_session_starts(engine_llm):
    held, turn, system = first_turn(engine_llm, "prewarm-on", is_prewarm_enabled=True)
    print(f"\nprewarmed: slot held before the first turn {held}; first turn {turn.stream.prompt_tokens} prompt "
          f"tokens, {turn.stream.cached_tokens} found cached (system prompt {system})")
    assert held == 1  # the session's slot, filled before anyone spoke
    assert turn.stream.cached_tokens > 0.8 * system  # the system prompt was not computed again
    held, cold, _ = first_turn(engine_llm, "prewarm-off", is_prewarm_enabled=False)
    assert held == 0 and cold.stream.cached_tokens == 0  # without it the first turn prefills everything
