"""The last-word signal of the end-of-turn decision: Whisper completes a fragment said before a
thinking pause with a word that has no voice under it ("What should I cook for | her?"), and such
a word cannot make the sentence finished.

First on scripted signals (no model), then on real audio: flite's "What should I cook for", cut
where ``voxlane bench turns`` cuts it, through the real VAD and ASR stages, read by the real
Whisper, Smart Turn and our engine's text probe."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pipeline.endpointing.decision import PauseSignals, fuse
from pipeline.endpointing.last_word import LastWord, is_doubtful
from pipeline.persona.persona import Endpointing

SEMANTIC = Endpointing(mode="semantic", short_silence_ms=192, long_silence_ms=1600, threshold=0.5)
# As measured in `bench turns` (signals at the pause of 04-flite-rms-pause1200): the words read
# "What should I cook for her?", the text probe 0.41, Smart Turn 0.12, Whisper's avg log-prob -0.33.
INVENTED = LastWord("her", start_ms=1500, end_ms=1800, voiced_end_ms=1504, probability=0.41)
HEARD = LastWord("tonight", start_ms=1680, end_ms=2040, voiced_end_ms=2304, probability=0.97)


def test_a_word_after_the_voice_or_an_unsure_pronoun_is_doubtful_a_heard_word_is_not():
    assert INVENTED.voiced_ms == pytest.approx(4)
    assert is_doubtful(INVENTED)
    assert is_doubtful(LastWord("it", 1580, 2400, 1728, 0.40))  # mostly in the silence after the voice
    assert is_doubtful(LastWord("them", 700, 920, 928, 0.52))  # "Who painted the" read as "them"
    assert is_doubtful(LastWord("it", 1340, 1340, 1280, 0.95))  # squeezed to nothing after the voice
    assert not is_doubtful(HEARD)
    assert not is_doubtful(LastWord("puppy?.", 1680, 3360, 2176, 0.79))  # stretched into the silence, but heard
    assert not is_doubtful(LastWord("ocean", 2040, 2040, 2176, 0.97))  # squeezed to nothing, but in the voice
    assert not is_doubtful(LastWord("that", 900, 1100, 1200, 0.95))  # "Can you say that?": a sure pronoun
    assert not is_doubtful(None)  # not timed: nothing to say


def test_the_fused_decision_waits_when_the_last_word_was_invented():
    assert fuse(p_audio=0.12, p_text=0.41, words_logprob=-0.33) > 0.5  # what cut the fragment
    assert fuse(p_audio=0.12, p_text=0.41, words_logprob=-0.33, last_word=INVENTED) < 0.5
    assert fuse(p_audio=0.12, p_text=0.41, words_logprob=-0.33, last_word=HEARD) > 0.5
    assert fuse(p_audio=0.9, p_text=None, last_word=INVENTED) == pytest.approx(0.9)  # no words read: the voice alone


def verdict(last_word: LastWord | None, endpointing: Endpointing = SEMANTIC, p_audio: float = 0.12,
            p_text: float = 0.41, words_logprob: float = -0.33):
    signals = PauseSignals(gen=1, expects_audio=True, expects_text=True)
    signals.words_logprob, signals.last_word = words_logprob, last_word
    signals.add("audio", p_audio)
    signals.add("text", p_text)
    return signals.verdict(endpointing)


def test_the_pause_verdict_takes_the_last_word_unless_the_persona_turns_the_check_off():
    waited = verdict(INVENTED)
    assert not waited.is_complete and waited.end_silence_ms == 1600
    assert verdict(HEARD).is_complete
    unchecked = dataclasses.replace(SEMANTIC, is_last_word_checked=False)
    cut = verdict(INVENTED, unchecked)
    assert cut.is_complete and cut.end_silence_ms == 192


def test_the_endpointer_keeps_the_last_word_of_words_probed_before_the_pause():
    from pipeline.endpointing.endpointer import Endpointer

    endpointer = Endpointer(None, can_probe_text=True, wake=lambda gen: None)
    endpointer.on_answer(1)
    endpointer.add_text(1, 0.41, -0.33, INVENTED)  # the answer's probe, before the judging pause
    endpointer.on_pause(1, np.zeros(16000, np.float32), SEMANTIC)
    assert endpointer.verdict(1) is not None and not endpointer.verdict(1).is_complete


FULL = "What should I cook for dinner tonight?"
FRAGMENT = "What should I cook for"


def read_at_the_pause(audio: np.ndarray, transcriber, vad_model):
    """The final transcript ASR sends at the first pause, through the real VAD and ASR stages fed
    32 ms frames as a session is (after the scripted user's 0.3 s lead-in)."""
    from pipeline.asr.stage import ASRStage
    from pipeline.config import ASRConfig, VADConfig
    from pipeline.frames import AudioIn, Transcript
    from pipeline.turns import TurnCounter
    from pipeline.vad.silero import SileroVAD
    from pipeline.vad.stage import VADStage
    from pipeline.waterfall import WaterfallBook

    asr = ASRStage(transcriber, ASRConfig(), lambda: "en", WaterfallBook())
    vad = VADStage(SileroVAD(vad_model), VADConfig(), TurnCounter(), lambda: Endpointing(mode="silence"),
                   WaterfallBook())
    stream = np.concatenate([np.zeros(4800, np.float32), audio, np.zeros(16000, np.float32)])
    for i in range(0, len(stream) - 511, 512):
        for frame in vad.process(AudioIn(gen=0, samples=stream[i:i + 512])):
            finals = [t for t in asr.process(frame) if isinstance(t, Transcript) and t.is_final]
            if finals:
                return finals[0]
    raise AssertionError("no final transcript")


def test_a_fragment_whisper_completes_with_an_invented_word_waits(transcriber, vad_model, engine_llm, tmp_path):
    """flite's "What should I cook for" before a pause is read "What should I cook for her?" (flite
    and Whisper are deterministic: the same words every run). The text probe reads that as a
    finished sentence and Smart Turn cannot outvote it, so without the last-word check the turn
    ends in the pause; with it, it waits. The whole question still ends after the short silence."""
    from app import model_store
    from bench.turn_set import cut_point, synthesize
    from pipeline.asr.guard import normalize
    from pipeline.endpointing.decision import strip_trailing_punctuation
    from pipeline.endpointing.smart_turn import SmartTurnModel
    from pipeline.persona.store import PersonaStore

    smart_turn = SmartTurnModel(model_store.resolve("smart-turn-v3.2", "turn"))
    persona = PersonaStore().get("nova")

    def judged(audio: np.ndarray, endpointing: Endpointing):
        final = read_at_the_pause(audio, transcriber, vad_model)
        words = strip_trailing_punctuation(final.text)
        messages = [{"role": "system", "content": persona.full_system_prompt()}, {"role": "user", "content": words}]
        p_text = engine_llm.probe_sentence_end(messages, "last-word-test")
        engine_llm.end_session("last-word-test")
        return final, verdict(final.last_word, endpointing, smart_turn(audio), p_text, final.avg_logprob)

    full = synthesize(FULL, "flite:rms", None, tmp_path)
    fragment = full[:cut_point(full, FULL, FRAGMENT, transcriber.model)]
    final, checked = judged(fragment, SEMANTIC)
    print(f"\n{final.text!r} {final.last_word} -> {checked}")
    assert normalize(final.text).split()[-1] != "for", final.text  # the premise: Whisper added a word
    assert is_doubtful(final.last_word)
    assert not checked.is_complete  # waits through the pause
    _, unchecked = judged(fragment, dataclasses.replace(SEMANTIC, is_last_word_checked=False))
    assert unchecked.is_complete  # what the check prevents: the fragment judged finished
    final, whole = judged(full, SEMANTIC)
    print(f"{final.text!r} {final.last_word} -> {whole}")
    assert not is_doubtful(final.last_word) and whole.is_complete
