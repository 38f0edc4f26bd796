"""The spoken form of ``bench answers``: a question as Piper audio through the whole voice pipeline
(VAD, Whisper, LLM, TTS), fed in real time like a microphone; the answer is scored by the same rules
as the typed one, and what Whisper heard is kept next to it."""
from __future__ import annotations

import dataclasses

import numpy as np

from bench.answer_set import Question


def ask_by_voice(models, config, persona, question: Question, timeout_s: float):
    """One question, spoken by the persona's own voice into a fresh voice session -> ``Answer``."""
    from bench.answers import Answer, after_origin_ms
    from app.scripted_user import InputAudio, ScriptedUser
    from pipeline.pipeline import Pipeline

    tts = models.tts(dataclasses.replace(persona.voice, variation=0.0))  # the same audio every run
    audio = InputAudio(np.concatenate(list(tts.synthesize(question.text, 1.0))), tts.sample_rate, 1)
    pipeline = Pipeline(llm=models.llm, tts=models.tts, personas=persona, transcriber=models.transcriber,
                        vad_model=models.vad_model, config=config.pipeline)
    try:
        # The whole answer's text; its audio need not play out in real time.
        result = ScriptedUser(pipeline, turn_timeout_s=timeout_s).run([audio], is_last_heard=False)
    finally:
        pipeline.close()
    turn = result.turns[0] if result.turns else None
    if turn is None:
        return Answer(question.text, question.kind, "[no turn]", ["no turn detected"], None, None, heard="")
    answer = turn.assistant or (f"[error: {turn.error}]" if turn.error else "")
    return Answer(question.text, question.kind, answer, question.failures(answer),
                  after_origin_ms(turn.waterfall, "llm_first_token"), turn.voice_to_voice_ms, heard=turn.user)
