"""The ASR stage's bookkeeping with a scripted transcriber (no model): the words are read at the
first silent frame after speech, and the final at the pause reuses them unless voice came after;
the final's last word is timed after the final is sent, and goes to the endpointer."""
from __future__ import annotations

import numpy as np

from pipeline.asr.stage import ASRStage
from pipeline.asr.whisper import ASRResult, WordTiming
from pipeline.config import ASRConfig
from pipeline.frames import Frame, SpeechPaused, Transcript, UserAudio
from pipeline.waterfall import WaterfallBook

FRAME = 512  # one VAD frame, 32 ms


class ScriptedTranscriber:
    """Says how many 32 ms frames of audio it was given, and counts its calls. ``events`` is the
    order of what happened: "read", "aligned" (a last word timed), and what ``feed`` saw sent."""

    def __init__(self):
        self.calls: list[tuple[int, bool]] = []  # (frames in the buffer, is_partial: skipped if it loops)
        self.events: list[str] = []

    def transcribe(self, audio, language="en", is_partial=False, with_last_word=False) -> ASRResult:
        self.calls.append((len(audio) // FRAME, is_partial))
        self.events.append("read")
        # the last word, when asked for: timed over the buffer's last two frames
        end_s = len(audio) / 16000
        last = WordTiming("frames", end_s - 2 * FRAME / 16000, end_s, 0.9) if with_last_word else None
        return ASRResult(f"{len(audio) // FRAME} frames", alignment=last)

    def time_last_word(self, result: ASRResult) -> WordTiming | None:
        if result.alignment is not None:
            self.events.append("aligned")
        return result.alignment  # (a real read keeps Whisper's tokens and encoder output there)


class LastWords:
    """Stands in for the endpointer: the last words the ASR stage reports, per gen."""

    def __init__(self, events: list[str]):
        self.events = events
        self.words: dict[int, object] = {}

    def add_last_word(self, gen: int, last_word) -> None:
        self.events.append("last word told")
        self.words[gen] = last_word


def feed(stage: ASRStage, pattern: str, gen: int = 1) -> list[Transcript]:
    """``pattern``: one character per frame, 'v' voiced, '.' silent, 'P' the pause."""
    out = []
    for mark in pattern:
        frame = SpeechPaused(gen=gen) if mark == "P" else UserAudio(gen=gen, samples=np.zeros(FRAME, np.float32),
                                                                    is_speech=mark == "v")
        for sent in stage.process(frame):  # as the stage thread emits them: one at a time, in order
            note(stage, sent)
            if isinstance(sent, Transcript):
                out.append(sent)
    return out


def note(stage: ASRStage, frame: Frame) -> None:
    if isinstance(frame, Transcript) and isinstance(stage.transcriber, ScriptedTranscriber):
        stage.transcriber.events.append("final sent" if frame.is_final else "partial sent")


def make_stage(**config) -> tuple[ASRStage, ScriptedTranscriber, WaterfallBook]:
    transcriber, book = ScriptedTranscriber(), WaterfallBook()
    config = ASRConfig(partial_interval_ms=10000, **config)  # no periodic partials: only the ones under test
    stage = ASRStage(transcriber, config, lambda: "en", book, endpointer=LastWords(transcriber.events))
    return stage, transcriber, book


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


def test_the_final_is_sent_before_its_last_word_is_timed():
    """The answer starts from the final's words: the alignment pass that times the last word
    (~12 ms quiet, ~40 at load 5) comes after the final is sent, whether the final reuses the read
    at the first silent frame or reads again; its result goes to the endpointer on its own."""
    stage, transcriber, _ = make_stage()
    feed(stage, "vvvvvvvvvv......P")
    assert transcriber.events == ["read", "partial sent", "final sent", "aligned", "last word told"]
    stage, transcriber, _ = make_stage()
    feed(stage, "vvvvv.v")
    feed(stage, "P")  # voice after the read: the pause reads again
    assert transcriber.events == ["read", "partial sent", "read", "final sent", "aligned", "last word told"]
    # as before (for A/Bs): the final waits for the alignment
    stage, transcriber, _ = make_stage(is_last_word_timed_first=True)
    feed(stage, "vvvvvvvvvv......P")
    assert transcriber.events == ["read", "partial sent", "aligned", "final sent", "last word told"]


def test_the_endpointer_is_told_the_finals_last_word_against_the_voice_of_the_buffer_it_read():
    stage, transcriber, book = make_stage()
    feed(stage, "vvvvvvvvvv......P")
    # read at the first silent frame: 11 frames, the word timed over frames 9-11, the voice ending after frame 10
    word = stage.endpointer.words[1]
    assert (word.start_ms, word.end_ms, word.voiced_end_ms) == (288.0, 352.0, 320.0)
    assert word.voiced_ms == 32.0
    assert book.get(1)["counts"]["last_word"].startswith("frames 288-352/320")
    # after a long pause only the audio after it is read, behind a gap of silence: the voiced end
    # is counted in that buffer, not in the utterance
    stage, transcriber, book = make_stage()
    feed(stage, "vvvvvvvvvv......P")
    stage._carry = (1, 2)
    transcripts = feed(stage, "." * 14, gen=1) + feed(stage, "vvvvv..P", gen=2)
    assert [t.gen for t in transcripts if t.is_final] == [2]
    gap_ms = 320  # MAX_GAP_MS of silence starts the new buffer
    assert stage.endpointer.words[2].voiced_end_ms == gap_ms + 5 * 32


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
    assert stage.endpointer.words[2] is None  # their last word was not timed in this read: nothing to check
