"""The speakable chunker: cuts the model's token stream into pieces TTS can start on.

The first piece is short (it ends at the first clause or sentence boundary after a few words)
so the first audio comes fast; later pieces end at sentence boundaries and run longer, which
sounds more natural. How much longer ramps up: piece n (from 0) is cut after at most
``first_max_words * 2**n`` words (3, 6, 12, 24, then ``max_words``), at a clause after half that, so each piece is
synthesized while the one before it plays (a 30-word second piece left seconds of silence after
the first under load). A boundary is only decided once the character after it has arrived, so
"3.14" and "e.g. this" are never split: a period followed by a digit is not a boundary, and a
period after a known abbreviation is not a sentence end.
"""
from __future__ import annotations

import re

from pipeline.config import ChunkerConfig
from pipeline.llm.speakable import FenceFilter, clean, numbers_an_item
from pipeline.persona.persona import SpeechRules

ABBREVIATIONS = frozenset({
    "e.g", "i.e", "etc", "vs", "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "no", "approx",
    "fig", "inc", "ltd", "co", "a.m", "p.m", "u.s", "u.k", "cf", "al", "dept", "est", "min", "max",
})
ENDS_SENTENCE_IF_CAPITAL = frozenset({"etc", "a.m", "p.m", "inc", "ltd", "co"})
# A dash is a clause boundary inside a line; after a newline it is a list bullet (the newline cuts).
_BOUNDARY = re.compile(r"([.!?…]+|[,;:]|[ \t][-–—]|—)[\"')\]]*(?=\s)|\n")
_WORD = re.compile(r"\S+")


class SpeakableChunker:
    """``feed(delta)`` returns the chunks completed by that delta; ``flush()`` the rest."""

    def __init__(self, config: ChunkerConfig | None = None, rules: SpeechRules | None = None):
        self.config = config or ChunkerConfig()
        self.rules = rules or SpeechRules()
        self._fences = FenceFilter() if self.rules.strip_markdown else None
        self._pending = ""
        self._before = ""  # the end of the raw text already cut off: does _pending start a line, a sentence?
        self.num_chunks = 0

    def feed(self, delta: str) -> list[str]:
        self._pending += self._fences.feed(delta) if self._fences else delta
        chunks = []
        while (cut := self._find_cut()) is not None:
            chunks += self._take(cut)
        return chunks

    def flush(self) -> list[str]:
        if self._fences:
            self._pending += self._fences.flush()
        return self._take(len(self._pending))

    def _take(self, cut: int) -> list[str]:
        piece, rest = self._pending[:cut], self._pending[cut:]
        self._pending = rest.lstrip()
        text = clean(piece, self.rules, self._before)
        self._before = (self._before + piece + rest[:len(rest) - len(self._pending)])[-16:]
        if not re.search(r"\w", text):  # only emoji, markup or punctuation: nothing to say
            return []
        self.num_chunks += 1
        return [text]

    def _words(self, end: int) -> int:
        return len(_WORD.findall(clean(self._pending[:end], self.rules, self._before)))

    def _find_cut(self) -> int | None:
        is_first = self.num_chunks == 0
        limit = self._max_words()
        clause_words = min(self.config.clause_words, max(self.config.min_words, limit // 2))
        for match in _BOUNDARY.finditer(self._pending):
            end = match.end()
            mark = match.group(0).strip()
            if mark == "":  # a newline: paragraphs and list items are always their own chunks
                if self._words(end) >= 1:
                    return end
                continue
            is_sentence = mark[0] in ".!?…"
            if is_sentence and not self._is_sentence_end(match.start()):
                continue
            words = self._words(end)
            if is_first and words >= self.config.first_min_words:
                return end
            if not is_first and is_sentence and words >= self.config.min_words:
                return end
            if not is_first and words >= clause_words:
                return end
        return self._forced_cut(limit)

    def _max_words(self) -> int:
        """The longest the next piece may be: doubling from the first's, up to max_words."""
        if self.num_chunks == 0:
            return self.config.first_max_words
        return min(self.config.max_words, self.config.first_max_words << min(self.num_chunks, 8))

    def _is_sentence_end(self, dot: int) -> bool:
        if self._pending[dot] != ".":
            return True
        start = max(self._pending.rfind(" ", 0, dot), self._pending.rfind("\n", 0, dot)) + 1
        token = self._pending[start:dot].lstrip("(\"'").lower()
        if len(token) == 1 and token.isalpha():
            return False  # an initial, as in "J. R. R. Tolkien"
        if token.isdigit() and len(token) <= 2 and self.rules.strip_markdown and \
                numbers_an_item(self._before + self._pending[:start], token):
            return False  # "Brew tea. 2. Pour it": the 2 numbers the next item, it is not a sentence
        if token in ABBREVIATIONS:
            following = self._pending[dot + 1:].lstrip()
            return token in ENDS_SENTENCE_IF_CAPITAL and following[:1].isupper()
        return True

    def _forced_cut(self, limit: int) -> int | None:
        """The word boundary after ``limit`` words, if that many complete words have arrived."""
        count = 0
        for match in _WORD.finditer(self._pending):
            if match.end() >= len(self._pending):
                return None  # the last word may still be growing
            if clean(match.group(0), self.rules):
                count += 1
            if count >= limit:
                return match.end()
        return None
