"""The first chunk's synthesis has the cores (``LLMStageConfig.is_first_audio_first``): on our engine
the answer writes no more tokens from the first SpeakChunk until the TTS stage has made its audio
(``SpeakChunk.on_synthesized``), then writes on to the same answer; the TTS stage calls back whether
the chunk was spoken or failed."""
from __future__ import annotations

import time

from pipeline.frames import AssistantDone, SpeakChunk, Transcript
from pipeline.persona.persona import Voice
from pipeline.tts.stage import TTSStage
from pipeline.waterfall import WaterfallBook
from tests.pipeline.fakes import SilentTTS
from tests.pipeline.test_early_answer import make_stage

QUESTION = "Tell me about the city of Paris."


def answer_with_a_slow_first_synthesis(engine_llm, session: str, **config) -> tuple[str, SpeakChunk, int]:
    """The stage's frames for one final transcript, taking 0.3 s to "synthesize" the first chunk:
    (the answer, its first chunk, tokens the engine wrote meanwhile)."""
    stage, _, _ = make_stage(engine_llm, session, max_tokens=48, is_early_answer_enabled=False, **config)
    stage.is_spoken = True  # as in a Pipeline, where the TTS stage calls back
    first, written = None, -1
    for frame in stage.process(Transcript(gen=1, text=QUESTION, is_final=True, avg_logprob=-0.1)):
        if isinstance(frame, SpeakChunk) and frame.index == 0:
            first, before = frame, engine_llm.engine.stats().tokens_generated
            time.sleep(0.3)
            written = engine_llm.engine.stats().tokens_generated - before
            if frame.on_synthesized is not None:
                frame.on_synthesized()
        if isinstance(frame, AssistantDone):
            engine_llm.end_session(session)
            return frame.text, first, written
    raise AssertionError("no AssistantDone")


def test_the_answer_waits_while_its_first_chunk_is_synthesized(engine_llm):
    held_answer, first, written = answer_with_a_slow_first_synthesis(engine_llm, "first-audio")
    assert first.on_synthesized is not None
    assert written <= 1, written  # at most the step already under way when the hold came
    unheld_answer, unheld_first, _ = answer_with_a_slow_first_synthesis(engine_llm, "first-audio-off",
                                                                        is_first_audio_first=False)
    assert unheld_first.on_synthesized is None
    assert held_answer == unheld_answer and len(held_answer.split()) > len(first.text.split()) + 3, held_answer


def test_the_tts_stage_calls_back_after_the_chunk_spoken_or_failed():
    stage, calls = TTSStage(lambda voice: SilentTTS(fail_on="boom"), WaterfallBook()), []
    spoken = list(stage.process(SpeakChunk(gen=1, text="Hello there.", voice=Voice(),
                                           on_synthesized=lambda: calls.append("spoken"))))
    assert calls == ["spoken"] and len(spoken) == 2  # the chunk, its audio
    try:
        list(stage.process(SpeakChunk(gen=1, text="boom", voice=Voice(), on_synthesized=lambda: calls.append("failed"))))
    except RuntimeError:
        pass
    assert calls == ["spoken", "failed"]
