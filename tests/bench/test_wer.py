"""The word-level measures the end-to-end tests and benchmarks judge transcripts with."""
from bench.wer import letters_missed, wer, word_errors


def test_word_errors_count_substitutions_deletions_and_insertions():
    assert word_errors("the capital of France is Paris", "the capital of Francis Eris") == (3, 6)
    assert word_errors("Paris.", "Paris Paris Paris Paris") == (3, 1)
    assert wer("What is the capital of France?", "what is the capital of france") == 0.0


def test_letters_missed_forgives_added_words_and_homophones_but_not_missing_words():
    assert letters_missed("Paris.", "Paris Paris Paris Paris") == 0.0
    assert letters_missed("The capital of France is", "the capital of Francis.") < 0.1
    assert letters_missed("found everywhere. They're everywhere.", "found everywhere. They are everywhere.") == 0.0
    assert letters_missed("The capital of France is", "Francis") > 0.6  # a chunk cut short
    assert letters_missed("The capital of France is", "") == 1.0  # its audio missing
    assert letters_missed("one two three", "three two one") > 0.5  # said out of order


def test_letters_missed_after_a_context_counts_only_what_is_said_after_it():
    # the previous chunk's audio, then this chunk's
    assert letters_missed("France is Paris.", "the capital of Francis Paris", "The capital of") < 0.1
    assert letters_missed("France is Paris.", "the capital of Paris", "The capital of") > 0.6  # cut to one word
    # this chunk's audio missing: the context's own letters cannot stand in for it
    assert letters_missed("everywhere.", "they're everywhere cats are", "They're everywhere. Cats are") == 1.0
