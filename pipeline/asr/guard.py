"""Guards against text Whisper invents: on silence, noise, or as a repetition loop.

Whisper was trained on subtitles, so on near-silence it likes to say "Thank you." or "Thanks for
watching!". A segment is kept only if it passes every rule; the reasons for dropping are
returned so tests and logs can tell which rule fired.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.config import ASRConfig


@dataclass(frozen=True)
class Segment:
    """What the guard needs from one Whisper segment."""

    text: str
    no_speech_prob: float
    avg_logprob: float
    compression_ratio: float


def normalize(text: str) -> str:
    """Lower case, punctuation removed, single spaces: how phrases and WER compare text."""
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())


def drop_reason(segment: Segment, config: ASRConfig) -> str | None:
    """Why the segment should be dropped, or None to keep it."""
    if not segment.text.strip():
        return "empty"
    if segment.no_speech_prob > config.no_speech_threshold and segment.avg_logprob < config.logprob_threshold:
        return "no speech"
    if segment.avg_logprob < config.min_logprob:
        return "low log-probability"
    if segment.compression_ratio > config.max_compression_ratio:
        return "repetition"
    phantoms = {normalize(p) for p in config.phantom_phrases}
    if normalize(segment.text) in phantoms and segment.no_speech_prob > config.phantom_no_speech:
        return "phantom phrase"
    return None


def keep_segments(segments: list[Segment], config: ASRConfig) -> tuple[str, list[str]]:
    """The kept text, and one reason per dropped segment."""
    kept, reasons = [], []
    for segment in segments:
        reason = drop_reason(segment, config)
        if reason is None:
            kept.append(segment.text.strip())
        else:
            reasons.append(f"{reason}: {segment.text.strip()!r}")
    return " ".join(kept).strip(), reasons
