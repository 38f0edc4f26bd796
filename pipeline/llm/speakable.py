"""What must never be read aloud: markdown syntax, code blocks, emoji and URLs.

``clean`` works on a complete piece of text; ``FenceFilter`` removes fenced code blocks from a
stream, where a fence may arrive split across deltas.
"""
from __future__ import annotations

import re

from pipeline.persona.persona import SpeechRules

_URL = re.compile(r"<?\b(?:https?://|www\.)[^\s<>()\[\]]+>?", re.IGNORECASE)
_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_LINE_MARKERS = re.compile(r"(?m)^[ \t]*(?:#{1,6}[ \t]+|>[ \t]?|[-*+•][ \t]+|\d{1,3}[.)][ \t]+)")
_EMPHASIS = re.compile(r"(\*\*|__|~~|\*|_)(?=\S)(.+?)(?<=\S)\1")
_INLINE_CODE = re.compile(r"`([^`]*)`")
_EMOJI = re.compile(
    "[\U0001F000-\U0001FAFF\U00002600-\U000027BF\U0001F1E6-\U0001F1FF\U00002B00-\U00002BFF"
    "\U0000FE0F\U0000200D\U000020E3\U0001F3FB-\U0001F3FF]+"
)
_SPACES = re.compile(r"[ \t\r\f\v]+")


def clean(text: str, rules: SpeechRules) -> str:
    """Text as it should be spoken: markup removed, whitespace collapsed to single spaces."""
    if rules.strip_urls:
        text = _URL.sub("", text)
    if rules.strip_markdown:
        text = _IMAGE.sub(r"\1", text)
        text = _LINK.sub(r"\1", text)
        text = _LINE_MARKERS.sub("", text)
        text = _INLINE_CODE.sub(r"\1", text)
        text = _EMPHASIS.sub(r"\2", text)
        text = text.replace("|", " ").replace("`", "")
        text = re.sub(r"(?<!\w)[*_]{1,3}(?!\w)", " ", text)  # stray emphasis markers
    if rules.strip_emoji:
        text = _EMOJI.sub("", text)
    text = _SPACES.sub(" ", text.replace("\n", " "))
    return re.sub(r"\s+([,.;:!?])", r"\1", text).strip()


class FenceFilter:
    """Drops ```fenced``` code blocks from a stream of deltas (code is shown, never spoken)."""

    def __init__(self) -> None:
        self.is_in_fence = False
        self._held = ""  # trailing backticks that may become a fence with the next delta

    def feed(self, delta: str) -> str:
        text, self._held = self._held + delta, ""
        out = []
        while True:
            at = text.find("```")
            if at < 0:
                break
            if not self.is_in_fence:
                out.append(text[:at])
            self.is_in_fence = not self.is_in_fence
            text = text[at + 3:]
        tail = len(text) - len(text.rstrip("`"))
        if tail:
            self._held, text = text[-tail:], text[:-tail]
        if not self.is_in_fence:
            out.append(text)
        return "".join(out)

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.is_in_fence else held
