"""The words' end-of-turn probe read by the answer's own prefill on our engine ("semantic" mode):
the read ASR takes at the first silent frame and the final that reuses it at the pause cost one
engine request (the answer), not a probe and then the answer; the endpointer gets the probability
a separate probe gives."""
from __future__ import annotations

import dataclasses

import numpy as np

from pipeline.config import ChunkerConfig, LLMStageConfig
from pipeline.endpointing.endpointer import Endpointer
from pipeline.frames import AssistantDone, Transcript
from pipeline.llm.history import History
from pipeline.llm.stage import LLMStage
from pipeline.persona.store import PersonaStore
from pipeline.waterfall import WaterfallBook

WORDS = "What is the capital of France"


def test_the_answer_at_the_pause_is_the_only_request_and_carries_the_words_probe(engine_llm):
    nova = PersonaStore().get("nova")
    persona = dataclasses.replace(nova, sampling=dataclasses.replace(nova.sampling, temperature=0.0, max_tokens=8))
    assert persona.endpointing.mode == "semantic"
    endpointer = Endpointer(None, can_probe_text=True, wake=lambda gen: None)
    book = WaterfallBook()
    stage = LLMStage(engine_llm, lambda: persona, History(), LLMStageConfig(is_prewarm_enabled=False),
                     ChunkerConfig(), book, session="answer-probe", endpointer=endpointer)
    submitted = []
    submit = engine_llm.engine.submit
    engine_llm.engine.submit = lambda *args, **kwargs: submitted.append(kwargs.get("probe_at")) or submit(*args, **kwargs)
    try:
        endpointer.on_answer(1)  # the answer pause, as the VAD stage says it
        # ASR's read at the first silent frame, then the final at the pause with the same words
        list(stage.process(Transcript(gen=1, text=WORDS + "?", is_final=False, is_at_silence=True)))
        frames = list(stage.process(Transcript(gen=1, text=WORDS + "?", is_final=True, avg_logprob=-0.1)))
    finally:
        engine_llm.engine.submit = submit
    assert len(submitted) == 1 and submitted[0] is not None  # one request: the answer, probing the words
    assert "Paris" in next(f for f in frames if isinstance(f, AssistantDone)).text
    assert book.get(1)["counts"].get("text_probe_in_answer") == 1
    endpointer.on_pause(1, np.zeros(16000, np.float32), persona.endpointing)  # the judging pause
    expected = engine_llm.probe_sentence_end(stage._prompt(1, persona, WORDS)[0], "answer-probe-alone")
    assert endpointer.verdict(1) is not None and abs(endpointer.verdict(1).p_text - expected) < 1e-4
    for session in ("answer-probe", "answer-probe-alone"):
        engine_llm.end_session(session)
