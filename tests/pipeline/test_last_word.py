"""The last-word signal of the end-of-turn decision: Whisper completes a fragment said before a
thinking pause with a word that has no voice under it ("What should I cook for | her?"), and such
a word cannot make the sentence finished. ASR times that word after sending the final, and the
verdict waits for it up to a deadline.

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
from tests.pipeline.test_asr_stage import LastWords

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


def timing_endpointer(wakes: list[int] | None = None):
    from pipeline.endpointing.endpointer import Endpointer

    return Endpointer(None, can_probe_text=True, wake=(wakes if wakes is not None else []).append,
                      times_last_word=True)


def test_the_endpointer_keeps_the_last_word_of_words_probed_before_the_pause():
    endpointer = timing_endpointer()
    endpointer.on_answer(1)
    endpointer.add_text(1, 0.41, -0.33)  # the answer's probe, before the judging pause
    endpointer.add_last_word(1, INVENTED)  # ASR timed it after sending the final
    endpointer.on_pause(1, np.zeros(16000, np.float32), SEMANTIC)
    assert endpointer.verdict(1) is not None and not endpointer.verdict(1).is_complete


def test_the_verdict_waits_for_a_late_last_word_up_to_its_deadline_and_decides_with_it():
    from pipeline.endpointing.endpointer import LAST_WORD_DEADLINE_MS

    wakes: list[int] = []
    endpointer = timing_endpointer(wakes)
    endpointer.on_answer(1)
    endpointer.add_text(1, 0.41, -0.33)  # the words are in (and the voice: no scorer here) ...
    endpointer.on_pause(1, np.zeros(16000, np.float32), SEMANTIC)
    assert endpointer.verdict(1) is None  # ... but not their last word: the verdict waits
    assert endpointer.end_silence_ms(1, SEMANTIC) == 1600  # (pending: nothing ends the turn early)
    assert not endpointer.on_silence(1, LAST_WORD_DEADLINE_MS - 32)  # before the deadline: still waiting
    assert endpointer.verdict(1) is None and wakes == []
    endpointer.add_last_word(1, INVENTED)
    verdict = endpointer.verdict(1)
    assert verdict is not None and not verdict.is_complete and not verdict.is_last_word_late  # decided with it
    assert wakes == [1]  # the VAD stage applies it at once
    assert not endpointer.on_silence(1, LAST_WORD_DEADLINE_MS)  # decided: the deadline changes nothing

    heard = timing_endpointer()  # a heard last word: finished
    heard.on_pause(1, np.zeros(16000, np.float32), SEMANTIC)
    heard.add_text(1, 0.41, -0.33)
    assert heard.verdict(1) is None
    heard.add_last_word(1, HEARD)
    assert heard.verdict(1).is_complete


def test_past_its_deadline_the_verdict_decides_without_the_last_word_as_when_it_is_not_timed():
    from pipeline.endpointing.endpointer import LAST_WORD_DEADLINE_MS

    endpointer = timing_endpointer()
    endpointer.on_pause(1, np.zeros(16000, np.float32), SEMANTIC)
    endpointer.add_text(1, 0.41, -0.33)
    assert endpointer.on_silence(1, LAST_WORD_DEADLINE_MS)  # made the verdict (the caller applies it)
    verdict = endpointer.verdict(1)
    assert verdict.is_complete and verdict.is_last_word_late  # the words alone: finished, as unchecked
    endpointer.add_last_word(1, INVENTED)  # too late: the turn is decided
    assert endpointer.verdict(1) is verdict
    # a deadline passed while another signal is still out: a word that comes before that signal counts
    endpointer = timing_endpointer()
    endpointer.on_pause(1, np.zeros(16000, np.float32), SEMANTIC)
    assert not endpointer.on_silence(1, LAST_WORD_DEADLINE_MS)
    endpointer.add_last_word(1, INVENTED)
    endpointer.add_text(1, 0.41, -0.33)
    assert not endpointer.verdict(1).is_complete and not endpointer.verdict(1).is_last_word_late
    # nothing to wait for when the persona does not check the last word
    unchecked = timing_endpointer()
    unchecked.on_pause(1, np.zeros(16000, np.float32), dataclasses.replace(SEMANTIC, is_last_word_checked=False))
    unchecked.add_text(1, 0.41, -0.33)
    assert unchecked.verdict(1).is_complete


def test_the_vad_stage_ends_the_turn_at_the_deadline_without_the_last_word_and_counts_it():
    """In audio time: the words say finished, their last word is never timed (a stalled alignment);
    at LAST_WORD_DEADLINE_MS of silence the turn is judged without it and ends at once."""
    from pipeline.endpointing.endpointer import LAST_WORD_DEADLINE_MS
    from pipeline.frames import SpeechEnded, TurnJudged
    from tests.pipeline.test_endpointing import SEMANTIC as VAD_SEMANTIC, Harness, frames, speak_then_pause

    h = Harness(VAD_SEMANTIC)
    h.endpointer = h.stage.endpointer = timing_endpointer(h.ticks)
    last_voiced = speak_then_pause(h)
    h.text_signal(0.4)
    assert not h.of(TurnJudged)  # waiting for the last word
    h.feed(0.0, frames(1000))
    [(judged_at, judged)] = h.of(TurnJudged)
    [(end, _)] = h.of(SpeechEnded)
    assert judged.is_complete and judged_at == end == last_voiced + frames(LAST_WORD_DEADLINE_MS)
    assert h.stage.book.get(judged.gen)["counts"]["last_word_late"] == 1


FULL = "What should I cook for dinner tonight?"
FRAGMENT = "What should I cook for"


def read_at_the_pause(audio: np.ndarray, transcriber, vad_model):
    """The final transcript ASR sends at the first pause, and its last word (timed after it), through
    the real VAD and ASR stages fed 32 ms frames as a session is (after the scripted user's 0.3 s lead-in)."""
    from pipeline.asr.stage import ASRStage
    from pipeline.config import ASRConfig, VADConfig
    from pipeline.frames import AudioIn, Transcript
    from pipeline.turns import TurnCounter
    from pipeline.vad.silero import SileroVAD
    from pipeline.vad.stage import VADStage
    from pipeline.waterfall import WaterfallBook

    told = LastWords([])  # stands in for the endpointer
    asr = ASRStage(transcriber, ASRConfig(), lambda: "en", WaterfallBook(), endpointer=told)
    vad = VADStage(SileroVAD(vad_model), VADConfig(), TurnCounter(), lambda: Endpointing(mode="silence"),
                   WaterfallBook())
    stream = np.concatenate([np.zeros(4800, np.float32), audio, np.zeros(16000, np.float32)])
    for i in range(0, len(stream) - 511, 512):
        for frame in vad.process(AudioIn(gen=0, samples=stream[i:i + 512])):
            finals = [t for t in asr.process(frame) if isinstance(t, Transcript) and t.is_final]
            if finals:  # (the stage timed the last word after sending the final, in the same call)
                return finals[0], told.words[finals[0].gen]
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
        final, last_word = read_at_the_pause(audio, transcriber, vad_model)
        words = strip_trailing_punctuation(final.text)
        messages = [{"role": "system", "content": persona.full_system_prompt()}, {"role": "user", "content": words}]
        p_text = engine_llm.probe_sentence_end(messages, "last-word-test")
        engine_llm.end_session("last-word-test")
        return (final, last_word), verdict(last_word, endpointing, smart_turn(audio), p_text, final.avg_logprob)

    full = synthesize(FULL, "flite:rms", None, tmp_path)
    fragment = full[:cut_point(full, FULL, FRAGMENT, transcriber.model)]
    (final, last_word), checked = judged(fragment, SEMANTIC)
    print(f"\n{final.text!r} {last_word} -> {checked}")
    assert normalize(final.text).split()[-1] != "for", final.text  # the premise: Whisper added a word
    assert is_doubtful(last_word)
    assert not checked.is_complete  # waits through the pause
    _, unchecked = judged(fragment, dataclasses.replace(SEMANTIC, is_last_word_checked=False))
    assert unchecked.is_complete  # what the check prevents: the fragment judged finished
    (final, last_word), whole = judged(full, SEMANTIC)
    print(f"{final.text!r} {last_word} -> {whole}")
    assert last_word is not None and not is_doubtful(last_word) and whole.is_complete
