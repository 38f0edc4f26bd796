"""The answer started at a partial transcript whose words read as finished (``EarlyAnswer``), on our
engine with SmolLM2: the final that says the same words adopts it (one answer request, the answer a
fresh request gives); a partial with other words, an interruption, or a fragment's partial leave no
early request running."""
from __future__ import annotations

import dataclasses

from pipeline.config import ChunkerConfig, LLMStageConfig
from pipeline.endpointing.endpointer import Endpointer
from pipeline.frames import AssistantDone, Interrupt, Transcript
from pipeline.llm.history import History
from pipeline.llm.stage import LLMStage
from pipeline.persona.store import PersonaStore
from pipeline.waterfall import WaterfallBook
from tests.pipeline.test_prewarm import StreamsKept

QUESTION = "What is the capital of France?"


def make_stage(engine_llm, session: str, max_tokens: int = 12, **config):
    """A bare LLM stage in semantic endpointing (frames processed in order, as its thread would),
    with the backend wrapped to keep every generation it starts."""
    llm = StreamsKept(engine_llm)
    nova = PersonaStore().get("nova")
    persona = dataclasses.replace(nova, sampling=dataclasses.replace(nova.sampling, temperature=0.0, max_tokens=max_tokens))
    assert persona.endpointing.mode == "semantic"
    book = WaterfallBook()
    stage = LLMStage(llm, lambda: persona, History(), LLMStageConfig(is_prewarm_enabled=False, **config),
                     ChunkerConfig(), book, session=session,
                     endpointer=Endpointer(None, can_probe_text=True, wake=lambda gen: None))
    return stage, llm, book


def partial(stage, text: str, gen: int = 1) -> None:
    assert [f.text for f in stage.process(Transcript(gen=gen, text=text, is_final=False))] == [text]


def final_answer(stage, text: str, gen: int = 1) -> str:
    frames = list(stage.process(Transcript(gen=gen, text=text, is_final=True, avg_logprob=-0.1)))
    return next(f for f in frames if isinstance(f, AssistantDone)).text


def test_the_final_adopts_the_answer_started_at_a_partial_with_its_words(engine_llm):
    stage, llm, book = make_stage(engine_llm, "early")
    partial(stage, "What is the")  # a fragment: its words do not end a sentence, nothing starts
    assert llm.generations == []
    partial(stage, QUESTION)
    assert len(llm.generations) == 1  # the early answer, started while the user may speak on
    partial(stage, QUESTION)  # ASR reads the same words again: the same request goes on
    answer = final_answer(stage, QUESTION)
    assert len(llm.generations) == 1 and llm.generations[0][1].finish_reason in ("stop", "length")
    counts = book.get(1)["counts"]
    assert counts.get("early_answers") == 1 and counts.get("early_answer_adopted") == 1
    alone, llm_alone, _ = make_stage(engine_llm, "early-off", is_early_answer_enabled=False)
    partial(alone, QUESTION)
    assert final_answer(alone, QUESTION) == answer and "Paris" in answer  # the answer a fresh request gives
    assert len(llm_alone.generations) == 1
    for session in ("early", "early-off"):
        engine_llm.end_session(session)


def test_other_words_or_an_interruption_cancel_the_early_answer(engine_llm):
    stage, llm, book = make_stage(engine_llm, "early-cancel", max_tokens=64)  # still writing when cancelled
    partial(stage, "Tell me about Paris.")
    assert len(llm.generations) == 1
    first = llm.generations[0][1]
    partial(stage, "Tell me about Paris and its museums.")  # the user went on: that answer is wrong now
    list(first)  # (the stream ends at the engine's next step)
    assert first.finish_reason == "cancelled"
    answer = final_answer(stage, "Tell me about Paris and its history.")  # other words again
    assert llm.generations[-1][0][-1]["content"] == "Tell me about Paris and its history."
    assert answer and book.get(1)["counts"].get("early_answer_adopted") is None
    for _, cancelled in llm.generations[1:-1]:  # an early answer to the museums, if one started
        list(cancelled)
        assert cancelled.finish_reason == "cancelled"

    partial(stage, QUESTION, gen=2)
    assert llm.generations[-1][0][-1]["content"] == QUESTION
    early = llm.generations[-1][1]
    stage.on_system(Interrupt(gen=3))  # the user barged in, or the session closes
    list(early)
    assert early.finish_reason == "cancelled"
    engine_llm.end_session("early-cancel")


def test_a_high_threshold_or_no_session_starts_no_early_answer(engine_llm):
    stage, llm, _ = make_stage(engine_llm, "early-strict", early_answer_min_p=1.0)
    partial(stage, QUESTION)
    assert llm.generations == []
    engine_llm.end_session("early-strict")
