"""The labelled set of ``voxlane bench turns``: the thinking pause lands between the right words
(real Piper speech, Whisper's word timestamps) and is exactly the silence asked for (sox)."""
from __future__ import annotations

import json

import numpy as np

from bench.turn_set import DEV_SENTENCES, cut_point, insert_pause, synthesize
from bench.turns import end_outcome, mode_report
from bench.wer import wer


def test_the_pause_goes_where_the_sentence_is_unfinished(piper_voice_path, whisper_base_dir, tmp_path):
    from pipeline.asr.whisper import WhisperTranscriber
    from pipeline.config import ASRConfig
    from pipeline.tts.piper_tts import PiperTTS

    transcriber = WhisperTranscriber(whisper_base_dir, ASRConfig())
    # Four words after the cut, not one: a lone "Spain?" was once heard as "spin.". The voice has no
    # sampled variation, so the audio, and what Whisper hears of it, is the same every run (with
    # Piper's noise, CI once heard the prefix as "Remind me to remind me to").
    text, prefix = DEV_SENTENCES[1]  # "Remind me to | buy milk tomorrow morning."
    audio = synthesize(text, "piper", PiperTTS(piper_voice_path, variation=0.0), tmp_path)
    at = cut_point(audio, text, prefix, transcriber.model)
    paused = insert_pause(audio, at, 900, tmp_path)
    assert len(paused) == len(audio) + 900 * 16
    assert np.abs(paused[at:at + 900 * 16]).max() < 1e-3  # the inserted silence
    np.testing.assert_allclose(paused[at + 900 * 16:], audio[at:], atol=1e-4)
    first, rest = transcriber.transcribe(audio[:at]).text, transcriber.transcribe(audio[at:]).text
    assert wer(prefix, first) <= 0.34 and wer(text[len(prefix):], rest) <= 0.25, (first, rest)


def test_the_report_counts_cuts_on_paused_items_and_missed_ends_on_complete_ones():
    rows = [{"complete": False, "false_cut": True, "pause_ms": 1200}, {"complete": False, "false_cut": False},
            {"complete": False, "false_cut": True, "pause_ms": 1000}, {"complete": False, "false_cut": False, "pause_ms": 500},
            {"complete": True, "missed_end": True, "late_verdict": True, "voice_to_voice_ms": 2100.0},
            {"complete": True, "missed_end": False, "voice_to_voice_ms": 400.0},
            {"complete": True, "missed_end": False, "voice_to_voice_ms": None}]
    report = mode_report(rows)
    assert (report["false_cuts"], report["paused_items"], report["false_cut_rate"]) == (2, 4, 0.5)
    # the target's scope: pauses up to 1 s (a row without its pause counts in the total only)
    assert (report["false_cuts_up_to_1s"], report["paused_items_up_to_1s"]) == (1, 2)
    assert (report["missed_ends"], report["late_verdicts"], report["complete_items"], report["unanswered"]) == (1, 1, 3, 1)
    assert report["voice_to_voice_ms"]["n"] == 2


def test_a_finished_question_judged_unfinished_is_a_missed_end_whatever_the_wall_clock_says():
    from pipeline.persona.persona import Endpointing

    semantic = Endpointing(mode="semantic", short_silence_ms=200, long_silence_ms=1600, threshold=0.5)
    # judged unfinished, but the input had stalled: the wall clock says it ended after 1308 ms
    assert end_outcome(True, semantic, 1308.3, 0.2513) == (True, False)
    assert end_outcome(True, semantic, 230.0, 0.97) == (False, False)  # judged finished, ended short
    assert end_outcome(True, semantic, 1650.0, 0.97) == (True, True)  # judged finished too late
    assert end_outcome(True, semantic, 1650.0, None) == (True, False)  # no verdict: the long silence
    assert end_outcome(False, semantic, 1650.0, 0.1) == (False, False)  # a paused item has no end to miss
    silence = Endpointing(mode="silence", silence_ms=500)
    assert end_outcome(True, silence, 520.0, None) == (False, False)


def test_bench_turns_runs_end_to_end_on_one_sentence(capsys):
    """``voxlane bench turns`` itself, smallest form: one sentence (whole, and with its thinking
    pause) through real sessions in semantic mode; the report has both items and the finished one
    was answered."""
    from bench.turns import main

    assert main(["--sentences", "1", "--modes", "semantic", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["conditions"]["items"] == 2
    report = data["modes"]["semantic"]
    assert (report["paused_items"], report["complete_items"], report["unanswered"]) == (1, 1, 0), report
    assert all(row["turns"] >= 1 and row["heard"] for row in data["rows"]["semantic"]), data["rows"]
    print(json.dumps(report))  # the figures, for the log: reported, not asserted


def test_the_held_out_sets_share_no_sentence_with_the_dev_set_and_each_cut_is_a_prefix():
    from bench.turn_set import SETS

    sentences = [text for pairs in SETS.values() for text, _ in pairs]
    assert len(sentences) == len(set(sentences))  # a rule chosen on one set is reported on others
    assert {name: len(pairs) for name, pairs in SETS.items()} == \
        {"dev": 24, "held-out": 24, "held-out-2": 24, "held-out-3": 48}
    for pairs in SETS.values():
        for text, prefix in pairs:
            assert text.startswith(prefix) and len(prefix) < len(text) - 3, (text, prefix)
    # held-out-3 cuts after each kind of word in turn, eight of each (the comment beside each pair)
    last_words = [prefix.split()[-1].lower() for _, prefix in SETS["held-out-3"]]
    assert sum(word == "and" for word in last_words) == 8
    assert sum(word in ("my", "our", "their") or word.endswith("'s") for word in last_words) == 8
    assert sum(word in ("two", "three", "five", "ten", "twenty", "thirty", "hundred") for word in last_words) == 8
    assert sum(word in ("a", "an", "the") for word in last_words) == 8


def test_held_out_3_items_are_built_in_the_same_scheme(monkeypatch, tmp_path):
    """Each sentence of held-out-3 gives a whole item and a paused one, voices, pauses and noise in
    the same turn as the other sets (synthesis, cut and pause faked: the scheme is what is checked)."""
    import bench.turn_set as turn_set

    monkeypatch.setattr(turn_set, "synthesize", lambda text, voice, piper, workdir: np.full(16000, 0.1, np.float32))
    monkeypatch.setattr(turn_set, "cut_point", lambda full, text, prefix, whisper: 8000)
    monkeypatch.setattr(turn_set, "insert_pause", lambda audio, at, ms, workdir: np.concatenate(
        [audio[:at], np.zeros(ms * 16, np.float32), audio[at:]]))
    items = turn_set.build_turn_set(None, None, name="held-out-3")
    assert len(items) == 96 and [i.is_complete for i in items] == [True, False] * 48
    assert [i.text for i in items[::2]] == [text for text, _ in turn_set.HELD_OUT_3_SENTENCES]
    paused = items[1::2]
    assert [i.voice for i in paused] == [turn_set.VOICES[k % 6] for k in range(48)]
    assert [(i.pause_end - i.pause_start) // 16 for i in paused] == [turn_set.PAUSES_MS[k % 6] for k in range(48)]
    assert [i.is_noisy for i in paused] == [k % 3 == 2 for k in range(48)]
    assert paused[5].name == "05-flite-kal16-pause800" and items[94].name == "47-flite-kal16-complete"
