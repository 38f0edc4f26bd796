"""Pipeline frames -> protocol messages, and the listening/thinking/speaking state they imply.

The pipeline's output frames are the single source of truth; this is the only place that knows
how each one looks on the wire (docs/protocol.md, "Server -> client").
"""
from __future__ import annotations

import numpy as np

from pipeline import frames as f

Outgoing = dict | bytes  # a JSON message, or the binary PCM16 that follows an "audio" header


def audio_messages(frame: f.AudioOut) -> tuple[dict, bytes]:
    pcm = np.ascontiguousarray(frame.pcm, dtype="<i2")
    header = {"type": "audio", "gen": frame.gen, "sample_rate": frame.sample_rate,
              "samples": int(pcm.size), "start_sample": frame.start_sample,
              "chunk_index": frame.chunk_index, "text": frame.text}
    return header, pcm.tobytes()


def to_messages(frame: f.Frame) -> list[Outgoing]:
    """The protocol messages for one output frame (none for frames a client does not need)."""
    gen = frame.gen
    if isinstance(frame, f.AudioOut):
        return list(audio_messages(frame))
    if isinstance(frame, f.TextDelta):
        return [{"type": "assistant_delta", "gen": gen, "text": frame.text}]
    if isinstance(frame, f.Transcript):
        return [{"type": "transcript", "gen": gen, "text": frame.text, "final": frame.is_final}]
    if isinstance(frame, f.SpeechStarted):
        return [{"type": "vad", "gen": gen, "event": "speech_started"}]
    if isinstance(frame, f.SpeechEnded):
        return [{"type": "vad", "gen": gen, "event": "speech_ended"}]
    if isinstance(frame, f.TurnJudged):
        return [{"type": "end_of_turn", "gen": gen, "complete": frame.is_complete,
                 "end_silence_ms": frame.end_silence_ms, "p_complete": _rounded(frame.p_complete),
                 "p_audio": _rounded(frame.p_audio), "p_text": _rounded(frame.p_text)}]
    if isinstance(frame, f.Interrupt):
        return [{"type": "interrupted", "gen": gen, "reason": frame.reason}]
    if isinstance(frame, f.PlaybackPause):
        return [{"type": "playback", "gen": gen, "action": "pause"}]
    if isinstance(frame, f.PlaybackResume):
        return [{"type": "playback", "gen": gen, "action": "resume"}]
    if isinstance(frame, f.SpeakChunk):
        return [{"type": "speak_chunk", "gen": gen, "index": frame.index, "text": frame.text}]
    if isinstance(frame, f.AssistantDone):
        return [{"type": "assistant_done", "gen": gen, "text": frame.text,
                 "interrupted": frame.is_interrupted, "num_tokens": frame.num_tokens}]
    if isinstance(frame, f.TurnDone):
        return [{"type": "turn", "gen": gen, "waterfall": _jsonable(frame.waterfall)}]
    if isinstance(frame, f.ErrorFrame):
        return [{"type": "error", "code": "pipeline_error", "gen": gen, "stage": frame.stage,
                 "message": frame.message, "fatal": False}]
    return []


def _rounded(p: float | None) -> float | None:
    return None if p is None else round(float(p), 4)


def _jsonable(value):
    """Waterfalls hold floats, ints, strings, None and nested dicts; numpy scalars become Python."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


class StateTracker:
    """Turns frames into the state the user sees, so they are never left in silence:
    ``listening`` (waiting for or hearing the user), ``thinking`` (the turn is over, no audio yet),
    ``speaking`` (assistant audio is going out). Only changes are reported."""

    def __init__(self) -> None:
        self.state = "listening"

    def update(self, frame: f.Frame) -> dict | None:
        new = self.state
        if isinstance(frame, (f.SpeechEnded, f.TextIn)):
            new = "thinking"
        elif isinstance(frame, f.AudioOut):
            new = "speaking"
        elif isinstance(frame, (f.TurnDone, f.Interrupt, f.SpeechStarted, f.ErrorFrame)):
            new = "listening"
        if new == self.state:
            return None
        self.state = new
        return {"type": "state", "gen": frame.gen, "state": new}
