"""The ASR stage's bookkeeping with a scripted transcriber (no model): the words are read at the
first silent frame after speech, and the final at the pause reuses them unless voice came after."""
from __future__ import annotations

import numpy as np

from pipeline.asr.stage import ASRStage
from pipeline.asr.whisper import ASRResult, WordTiming
from pipeline.config import ASRConfig
from pipeline.frames import SpeechPaused, Transcript, UserAudio
from pipeline.waterfall import WaterfallBook

FRAME = 512  # one VAD frame, 32 ms


class ScriptedTranscriber:
    """Says how many 32 ms frames of audio it was given, and counts its calls."""

    def __init__(self):
        self.calls: list[tuple[int, bool]] = []  # (frames in the buffer, is_partial: skipped if it loops)

    def transcribe(self, audio, language="en", is_partial=False, with_last_word=False) -> ASRResult:
        self.calls.append((len(audio) // FRAME, is_partial))
        # the last word, when asked for: timed over the buffer's last two frames
        end_s = len(audio) / 16000
        last = WordTiming("frames", end_s - 2 * FRAME / 16000, end_s, 0.9) if with_last_word else None
        return ASRResult(f"{len(audio) // FRAME} frames", last_word=last)


def feed(stage: ASRStage, pattern: str, gen: int = 1) -> list[Transcript]:
    """``pattern``: one character per frame, 'v' voiced, '.' silent, 'P' the pause."""
    out = []
    for mark in pattern:
        frame = SpeechPaused(gen=gen) if mark == "P" else UserAudio(gen=gen, samples=np.zeros(FRAME, np.float32),
                                                                    is_speech=mark == "v")
        out += [f for f in stage.process(frame) if isinstance(f, Transcript)]
    return out


def make_stage() -> tuple[ASRStage, ScriptedTranscriber, WaterfallBook]:
    transcriber, book = ScriptedTranscriber(), WaterfallBook()
    config = ASRConfig(partial_interval_ms=10000)  # no periodic partials: only the ones under test
    return ASRStage(transcriber, config, lambda: "en", book), transcriber, book


def test_the_words_are_read_at_the_first_silent_frame_and_the_pause_reuses_them():
    stage, transcriber, book = make_stage()
    transcripts = feed(stage, "vvvvvvvvvv......P")
    assert transcriber.calls == [(11, False)]  # one read, as a final: the ten voiced frames and the first silent one
    assert [(t.text, t.is_final) for t in transcripts] == [("11 frames", False), ("11 frames", True)]
    assert book.get(1)["counts"]["asr_final_reused"] == 1


def test_voice_after_that_read_makes_the_pause_read_again():
    stage, transcriber, book = make_stage()
    transcripts = feed(stage, "vvvvv..vvvvv......P")
    # a read at each silence onset (frames 6 and 13), then the final: the second read held every
    # voiced frame, so the pause reuses it
    assert transcriber.calls == [(6, False), (13, False)]
    assert [t.text for t in transcripts if t.is_final] == ["13 frames"]
    stage, transcriber, book = make_stage()
    feed(stage, "vvvvv.v")  # voiced again after the onset read, and no silence onset since
    feed(stage, "P")
    assert transcriber.calls == [(6, False), (7, False)]  # the final reads the whole buffer itself
    assert "asr_final_reused" not in book.get(1)["counts"]


def test_the_final_carries_its_last_word_against_the_voice_of_the_buffer_it_read():
    stage, transcriber, book = make_stage()
    [_, final] = feed(stage, "vvvvvvvvvv......P")
    # read at the first silent frame: 11 frames, the word timed over frames 9-11, the voice ending after frame 10
    word = final.last_word
    assert (word.start_ms, word.end_ms, word.voiced_end_ms) == (288.0, 352.0, 320.0)
    assert word.voiced_ms == 32.0
    assert book.get(1)["counts"]["last_word"].startswith("frames 288-352/320")
    # after a long pause only the audio after it is read, behind a gap of silence: the voiced end
    # is counted in that buffer, not in the utterance
    stage, transcriber, book = make_stage()
    feed(stage, "vvvvvvvvvv......P")
    stage._carry = (1, 2)
    transcripts = feed(stage, "." * 14, gen=1) + feed(stage, "vvvvv..P", gen=2)
    final = [t for t in transcripts if t.is_final][-1]
    gap_ms = 320  # MAX_GAP_MS of silence starts the new buffer
    assert final.last_word.voiced_end_ms == gap_ms + 5 * 32


def test_words_before_a_long_pause_are_the_final_when_nothing_after_it_is_kept():
    """A noisy "computer" read alone after the pause was dropped by the guard (measured on bench
    turns' dev item 17): the turn still has the words said before the pause, not none."""
    stage, transcriber, _ = make_stage()
    feed(stage, "vvvvvvvvvv......P")
    transcriber.transcribe = lambda audio, language="en", is_partial=False, with_last_word=False: ASRResult(
        "", dropped=["low log-probability: 'computer'"])
    stage._carry = (1, 2)
    transcripts = feed(stage, "." * 14, gen=1) + feed(stage, "vvvvv..P", gen=2)
    [final] = [t for t in transcripts if t.is_final]
    assert (final.gen, final.text) == (2, "11 frames")
