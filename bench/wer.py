"""Word error rate: (substitutions + deletions + insertions) / reference words, on normalized text
(lower case, no punctuation, contractions expanded, small numbers as digits); and the share of a
text's letters a transcript missed."""
from __future__ import annotations

import re

from pipeline.asr.guard import normalize

NUMBERS = {"one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7",
           "eight": "8", "nine": "9", "ten": "10", "twelve": "12", "twenty": "20"}


CONTRACTIONS = {"n't": " not", "'re": " are", "'ll": " will", "'ve": " have", "'m": " am", "'d": " would"}


def words(text: str) -> list[str]:
    text = text.lower().replace("’", "'").replace("-", " ")
    for short, long in CONTRACTIONS.items():
        text = text.replace(short, long)
    return [NUMBERS.get(w, w) for w in normalize(text).split()]


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(edit distance in words, number of reference words)."""
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1], len(ref)


def _common_length(a, b) -> int:
    """The length of the longest common subsequence of two sequences."""
    row = [0] * (len(b) + 1)  # row[j]: LCS of a's items so far and b[:j]
    for x in a:
        prev = 0  # the previous row's row[j - 1]
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], prev + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def letters(text: str) -> str:
    """The normalized words' letters and digits, run together: "France is" and "Francis" differ
    by one letter, not by two words."""
    return re.sub(r"[^a-z0-9]", "", "".join(words(text)))


def letters_missed(reference: str, hypothesis: str, context: str = "") -> float:
    """The fraction of the reference's letters the hypothesis does not say in their order (0..1).
    Added letters cost nothing (Whisper on a short clip repeats a word: "Paris." heard as "Paris
    Paris Paris Paris"), and homophones little ("France is Paris." as "Francis Paris": 0.08), so
    this asks "was everything said?". With ``context``, the hypothesis transcribes the context's
    audio followed by the reference's: only what is said after what the context accounts for
    counts (the context's own letters cannot stand in for the reference's)."""
    ref, hyp, ctx = letters(reference), letters(hypothesis), letters(context)
    if not ref:
        raise ValueError("nothing to hear in the reference")
    return 1.0 - (_common_length(ctx + ref, hyp) - _common_length(ctx, hyp)) / len(ref)


def wer(reference: str, hypothesis: str) -> float:
    errors, total = word_errors(reference, hypothesis)
    return errors / max(1, total)
