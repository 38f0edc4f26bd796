"""Turn-taking from VAD probabilities: starts only after min_speech_ms, blips never start a turn,
the answer's pause comes before the judging pause and the end, speech after a pause resumes the turn."""
from __future__ import annotations

from pipeline.config import VADConfig
from pipeline.persona.persona import Endpointing
from pipeline.vad.turn_detector import FRAME_MS, TurnDetector


def run(probs: list[float], endpointing=Endpointing(silence_ms=480, min_speech_ms=256),
        answer_pause_ms: int = 96) -> list[tuple[int, str]]:
    detector = TurnDetector(VADConfig(pause_ms=192, answer_pause_ms=answer_pause_ms, onset_gap_ms=160))
    events = []
    for i, p in enumerate(probs):
        events += [(i, e) for e in detector.update(p, endpointing)]
    return events


def frames(ms: int) -> int:
    return ms // FRAME_MS


def test_speech_starts_after_min_speech_then_pauses_then_ends():
    probs = [0.0] * 5 + [0.9] * frames(1000) + [0.05] * frames(800)
    events = run(probs)
    kinds = [e for _, e in events]
    assert kinds == ["onset", "start", "pause", "judge", "end"]
    onset, start, pause, judge, end = (i for i, _ in events)
    assert start - onset == frames(256) - 1  # confirmed once 256 ms of speech have been heard
    assert pause - (5 + frames(1000)) == frames(96) - 1  # the answer starts
    assert judge - (5 + frames(1000)) == frames(192) - 1  # the end-of-turn signals are read
    assert end - (5 + frames(1000)) == frames(480) - 1


def test_a_cough_is_a_blip_not_a_turn():
    probs = [0.0] * 5 + [0.95] * frames(160) + [0.0] * frames(600)
    assert [e for _, e in run(probs)] == ["onset", "blip"]


def test_hysteresis_keeps_speech_through_a_dip():
    probs = [0.0] * 3 + [0.9] * 20 + [0.4] * 10 + [0.9] * 5 + [0.0] * frames(600)
    assert [e for _, e in run(probs)] == ["onset", "start", "pause", "judge", "end"]


def test_speech_after_a_pause_resumes_the_turn():
    probs = [0.0] * 3 + [0.9] * 20 + [0.0] * frames(256) + [0.9] * 20 + [0.0] * frames(600)
    assert [e for _, e in run(probs)] == ["onset", "start", "pause", "judge", "resume", "pause", "judge", "end"]


def test_a_gap_shorter_than_the_judging_pause_restarts_the_answer_without_judging():
    # 128 ms between words: the answer started at 96 ms is void, the pause was never judged
    probs = [0.0] * 3 + [0.9] * 20 + [0.0] * frames(128) + [0.9] * 20 + [0.0] * frames(600)
    assert [e for _, e in run(probs)] == ["onset", "start", "pause", "resume", "pause", "judge", "end"]
    # a 64 ms gap starts nothing; an answer pause set above pause_ms acts as pause_ms
    probs = [0.0] * 3 + [0.9] * 20 + [0.0] * frames(64) + [0.9] * 20 + [0.0] * frames(600)
    assert [e for _, e in run(probs)] == ["onset", "start", "pause", "judge", "end"]
    events = run([0.0] * 3 + [0.9] * 20 + [0.0] * frames(600), answer_pause_ms=400)
    assert [e for _, e in events] == ["onset", "start", "pause", "judge", "end"] and events[2][0] == events[3][0]


def test_silence_and_low_noise_make_no_events():
    assert run([0.0] * 100) == []
    assert run([0.1, 0.2, 0.05, 0.24] * 25) == []  # under pause_threshold: not even a pause


def test_doubtful_frames_pause_playback_but_never_start_a_turn():
    events = [e for _, e in run([0.3, 0.45, 0.2, 0.49, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0] * 10)]
    assert "start" not in events and events.count("onset") == events.count("blip") > 0


def test_an_early_onset_frame_below_threshold_pauses_one_frame_sooner():
    events = run([0.0] * 3 + [0.27, 0.61] + [0.95] * 20 + [0.0] * frames(600))
    assert events[0] == (3, "onset")  # at the 0.27 frame, before the first frame over 0.5
    assert [e for _, e in events] == ["onset", "start", "pause", "judge", "end"]
