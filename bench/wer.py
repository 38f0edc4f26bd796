"""Word error rate: (substitutions + deletions + insertions) / reference words, on normalized text
(lower case, no punctuation, contractions expanded, small numbers as digits)."""
from __future__ import annotations

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


def words_missed(reference: str, hypothesis: str) -> tuple[int, int]:
    """(reference words the hypothesis does not say in their order, number of reference words):
    the reference's length minus the longest common subsequence of the two. Words the hypothesis
    adds cost nothing (Whisper on a short clip repeats a word: "Paris." heard as "Paris Paris Paris
    Paris"), so this asks only "was everything said?"."""
    ref, hyp = words(reference), words(hypothesis)
    row = [0] * (len(hyp) + 1)  # row[j]: LCS of the reference so far and hyp[:j]
    for r in ref:
        prev = 0  # the previous row's row[j - 1]
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], prev + 1 if r == h else max(row[j], row[j - 1])
    return len(ref) - row[-1], len(ref)


def wer(reference: str, hypothesis: str) -> float:
    errors, total = word_errors(reference, hypothesis)
    return errors / max(1, total)
