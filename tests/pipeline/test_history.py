"""History: budget trimming drops the oldest exchanges and never the system prompt; an interrupted
reply is remembered as heard; a dropped speculative exchange stays dropped."""
from __future__ import annotations

from pipeline.llm.history import History
from pipeline.playback import PlaybackTracker


def count(messages) -> int:
    return sum(len(m["content"].split()) for m in messages)


def test_oldest_exchanges_go_first_system_prompt_stays():
    history = History()
    for gen in range(1, 6):
        history.begin(gen, f"question {gen} " + "word " * 10)
        history.finish(gen, f"answer {gen} " + "word " * 10)
    messages = history.messages("SYSTEM PROMPT", 6, "new question", count, token_budget=60, max_turns=10)
    assert messages[0] == {"role": "system", "content": "SYSTEM PROMPT"}
    assert messages[-1] == {"role": "user", "content": "new question"}
    assert count(messages) <= 60
    kept = [m["content"].split()[1] for m in messages[1:-1]]
    assert kept == ["4", "4", "5", "5"]  # the two newest exchanges fit, in order


def test_system_prompt_survives_even_when_nothing_else_fits():
    history = History()
    history.begin(1, "a " * 100)
    history.finish(1, "b " * 100)
    messages = history.messages("SYS", 2, "hi", count, token_budget=10, max_turns=10)
    assert [m["role"] for m in messages] == ["system", "user"]


def test_interrupted_reply_keeps_only_what_was_heard():
    history = History()
    history.begin(1, "tell me a story")
    history.finish(1, "Once upon a time there was a dragon who loved tea.")
    history.cut(1, "Once upon a time")
    (exchange,) = history.exchanges()
    assert exchange.is_interrupted and exchange.reply == "Once upon a time"
    messages = history.messages("S", 2, "next", count, 1000, 10)
    assert messages[2] == {"role": "assistant", "content": "Once upon a time..."}


def test_a_dropped_speculative_exchange_never_comes_back():
    history = History()
    history.drop(3)
    history.begin(3, "half a sentence")
    history.finish(3, "an answer nobody heard")
    assert history.exchanges() == []


def test_playback_tracker_counts_heard_words_pro_rata():
    tracker = PlaybackTracker()
    tracker.on_audio(1, 0, "Once upon a time,", 0, 1000, 16000)
    tracker.on_audio(1, 1, "there was a small dragon.", 1000, 500, 16000)
    tracker.on_audio(1, 1, "there was a small dragon.", 1500, 500, 16000)  # a chunk in two pieces
    tracker.report(1, 1500)
    assert tracker.heard_text(1) == "Once upon a time, there was a"  # half the characters, by midpoint
    tracker.report(1, 2000)
    tracker.on_done(1)
    assert tracker.is_complete(1) and tracker.heard_text(1).endswith("dragon.")


def test_an_answer_that_begins_after_its_turn_is_over_leaves_no_exchange_of_its_own():
    """The LLM stage was still reading the words when the user went on (2: a speculative answer,
    voided) or barged in after finishing (1): neither answer can be heard. The voided turn leaves
    nothing (its words are in the next final already: ASR); the finished one is kept unheard."""
    history = History()
    history.end_before(3, committed={1})
    history.begin(1, "Tell me a joke")
    history.begin(2, "What is the")
    history.finish(1, "Why did the chicken")
    history.finish(2, "The what?")
    assert history.unsettled(3) == []
    assert [(e.gen, e.user, e.reply) for e in history.exchanges()] == [(1, "Tell me a joke", "")]
    assert history.messages("S", 3, "about cats.", count, 1000, 10)[1:] == [
        {"role": "user", "content": "Tell me a joke"}, {"role": "user", "content": "about cats."}]
