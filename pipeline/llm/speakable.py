"""What must never be read aloud: markdown syntax, code blocks, emoji and URLs.

``clean`` works on a piece of the answer, given the raw text that came before it (a list marker
is one only where a line or, for an inline "1. ... 2. ...", a sentence starts: "The answer is"
then "3. You can count them." keeps its 3); ``FenceFilter`` removes fenced code blocks from a
stream, where a fence may arrive split across deltas.
"""
from __future__ import annotations

import re

from pipeline.persona.persona import SpeechRules

_URL = re.compile(r"<?\b(?:https?://|www\.)[^\s<>()\[\]]+>?", re.IGNORECASE)
_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_LINE_MARKER = re.compile(r"^[ \t]*(?:#{1,6}[ \t]+|>[ \t]?|(?P<item>[-*+•][ \t]+|\d{1,3}[.)][ \t]+))")
# "1. Brew tea. 2. Pour it." written on one line: a number after a sentence's end, before a word.
_ENUMERATOR = re.compile(r"(?<=[.!?:])[ \t]+(?P<n>\d{1,2})[.)][ \t]+(?=[^\W\d_]|[*_])")
_ENUMERATOR_FIRST = re.compile(r"[ \t]*(?P<n>\d{1,2})[.)][ \t]+(?=[^\W\d_]|[*_])")
_ENDS_SENTENCE = re.compile(r"(?P<end>[.!?:\n])[\"')\]*_]*[ \t]*$")
_UNPUNCTUATED_END = re.compile(r"[^\W_][\"')\]*_~`]*[ \t]*$")
_EMPHASIS = re.compile(r"(\*\*|__|~~|\*|_)(?=\S)(.+?)(?<=\S)\1")
_INLINE_CODE = re.compile(r"`([^`]*)`")
_EMOJI = re.compile(
    "[\U0001F000-\U0001FAFF\U00002600-\U000027BF\U0001F1E6-\U0001F1FF\U00002B00-\U00002BFF"
    "\U0000FE0F\U0000200D\U000020E3\U0001F3FB-\U0001F3FF]+"
)
_SPACES = re.compile(r"[ \t\r\f\v]+")


def clean(text: str, rules: SpeechRules, before: str = "") -> str:
    """Text as it should be spoken: markup removed, whitespace collapsed to single spaces.

    ``before`` is the raw text the answer had before ``text`` ("" = ``text`` starts the answer):
    it says whether ``text`` starts a line or a sentence, where a list marker may stand."""
    if rules.strip_urls:
        text = _URL.sub("", text)
    if rules.strip_markdown:
        text = _IMAGE.sub(r"\1", text)
        text = _LINK.sub(r"\1", text)
        text = _unlist(text, before)
        text = _INLINE_CODE.sub(r"\1", text)
        text = _EMPHASIS.sub(r"\2", text)
        text = text.replace("|", " ").replace("`", "")
        # Emphasis cut in two by a chunk boundary ("**Limit screen" | "time**:") has no pair left,
        # and TTS says "asterisk": none is ever spoken; between numbers it was a multiplication.
        text = re.sub(r"(?<=\d) ?\* ?(?=\d)", " times ", text).replace("*", "")
        text = re.sub(r"(?<!\w)_{1,3}(?!\w)", " ", text)  # stray emphasis markers
    if rules.strip_emoji:
        text = _EMOJI.sub("", text)
    text = _SPACES.sub(" ", text.replace("\n", " "))
    return re.sub(r"\s+([,.;:!?])", r"\1", text).strip()


def numbers_an_item(before: str, number: str) -> bool:
    """Whether ``number`` followed by "." or ")" after the raw text ``before`` numbers a list item:
    it starts the answer or a line, or follows a sentence's end; after a colon only a 1 ("Tips:
    1. Sleep"), so that "Half of fifty: 25. Easy." keeps its 25."""
    end = _ENDS_SENTENCE.search(before)
    if not before.strip() or end and end.group("end") == "\n":
        return True
    return end is not None and (end.group("end") != ":" or number == "1")


def _unlist(text: str, before: str) -> str:
    """List and heading markers removed where a line starts (the first line only if ``before``
    ended one), inline "1. ... 2. ..." numbering where a sentence ended, and a line that ends
    without punctuation is given some, so that lines are not run together when joined: a list
    item a comma (spoken as a list, "Red, orange, yellow"), a heading or plain line a period."""
    starts_line = before == "" or before.rstrip(" \t").endswith("\n")
    lines = text.split("\n")
    for i, line in enumerate(lines):
        is_item = False
        if i > 0 or starts_line:
            marker = _LINE_MARKER.match(line)
            if marker:
                line, is_item = line[marker.end():], marker.group("item") is not None
        elif (first := _ENUMERATOR_FIRST.match(line)) and numbers_an_item(before, first.group("n")):
            line = line[first.end():]
        line = _ENUMERATOR.sub(lambda m: " " if numbers_an_item(line[:m.start()], m.group("n")) else m.group(0), line)
        if i < len(lines) - 1 and _UNPUNCTUATED_END.search(line):
            line = line.rstrip() + ("," if is_item else ".")
        lines[i] = line
    return "\n".join(lines)


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
