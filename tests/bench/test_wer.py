"""The word-level measures the end-to-end tests and benchmarks judge transcripts with."""
from bench.wer import wer, word_errors, words_missed


def test_word_errors_count_substitutions_deletions_and_insertions():
    assert word_errors("the capital of France is Paris", "the capital of Francis Eris") == (3, 6)
    assert word_errors("Paris.", "Paris Paris Paris Paris") == (3, 1)
    assert wer("What is the capital of France?", "what is the capital of france") == 0.0


def test_words_missed_ignores_added_words_but_not_missing_or_reordered_ones():
    assert words_missed("Paris.", "Paris Paris Paris Paris") == (0, 1)
    assert words_missed("towards humans.", "to war tumult") == (2, 2)
    assert words_missed("The capital of France is", "Francis") == (5, 5)  # a chunk cut short
    assert words_missed("The capital of France is", "") == (5, 5)  # its audio missing
    assert words_missed("one two three", "three two one") == (2, 3)  # only one word in order
    assert words_missed("a b c d", "x a y b z c w d v") == (0, 4)
