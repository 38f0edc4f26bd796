"""The ASR stage's bookkeeping with a scripted transcriber (no model): the words are read at the
first silent frame after speech, and the final at the pause reuses them unless voice came after."""
from __future__ import annotations

import numpy as np

from pipeline.asr.stage import ASRStage
from pipeline.asr.whisper import ASRResult
from pipeline.config import ASRConfig
from pipeline.frames import SpeechPaused, Transcript, UserAudio
from pipeline.waterfall import WaterfallBook

FRAME = 512  # one VAD frame, 32 ms


class ScriptedTranscriber:
    """Says how many 32 ms frames of audio it was given, and counts its calls."""

    def __init__(self):
        self.calls: list[tuple[int, bool]] = []  # (frames in the buffer, is_partial: skipped if it loops)

    def transcribe(self, audio, language="en", is_partial=False) -> ASRResult:
        self.calls.append((len(audio) // FRAME, is_partial))
        return ASRResult(f"{len(audio) // FRAME} frames")


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
