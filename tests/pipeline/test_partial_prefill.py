"""Speculative prefill of the user's words while they speak (``llm.is_partial_prefill_enabled``): each
partial transcript goes into the session's KV slot on our engine, so the final transcript's answer
prefills only the last words; the answer is the one a fresh prefill gives."""
from __future__ import annotations

import dataclasses

from pipeline.config import ChunkerConfig, LLMStageConfig
from pipeline.frames import AssistantDone, Transcript
from pipeline.llm.history import History
from pipeline.llm.stage import LLMStage
from pipeline.persona.store import PersonaStore
from pipeline.waterfall import WaterfallBook
from tests.pipeline.test_prewarm import StreamsKept

PARTIALS = ["What is the", "What is the capitol", "What is the capital of", "What is the capital of France"]
FINAL = "What is the capital of France?"


def answer(engine_llm, session: str, partials: list[str], enabled: bool = True):
    """(the answer's text, its generation) after ``partials`` then the final transcript, through a
    bare LLM stage (no threads: the frames are processed in order, as the stage's thread would)."""
    llm = StreamsKept(engine_llm)
    nova = PersonaStore().get("nova")
    persona = dataclasses.replace(nova, sampling=dataclasses.replace(nova.sampling, temperature=0.0, max_tokens=12))
    stage = LLMStage(llm, lambda: persona, History(), LLMStageConfig(is_partial_prefill_enabled=enabled,
                                                                   is_prewarm_enabled=False),
                     ChunkerConfig(), WaterfallBook(), session=session)
    for text in partials:
        assert [f.text for f in stage.process(Transcript(gen=1, text=text, is_final=False))] == [text]
    frames = list(stage.process(Transcript(gen=1, text=FINAL, is_final=True)))
    done = next(f for f in frames if isinstance(f, AssistantDone))
    return done.text, llm.generations[-1]


def test_partials_leave_only_the_last_words_to_prefill_and_the_same_answer(engine_llm):
    text, (messages, generation) = answer(engine_llm, "partial-talk", PARTIALS)
    prompt = engine_llm.count_tokens(messages)
    assert prompt - generation.cached_tokens <= 8  # "?" , end of turn, the assistant header
    fresh, (_, fresh_generation) = answer(engine_llm, "fresh-talk", PARTIALS, enabled=False)
    assert fresh_generation.cached_tokens < generation.cached_tokens
    assert text == fresh and "Paris" in text
    for session in ("partial-talk", "fresh-talk"):
        engine_llm.end_session(session)
