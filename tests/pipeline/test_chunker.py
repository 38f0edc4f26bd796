"""The speakable chunker: short first chunk, longer later ones, no splits inside numbers or
abbreviations, and nothing unspeakable (markdown, code, emoji, URLs) reaches TTS."""
from __future__ import annotations

import pytest

from pipeline.config import ChunkerConfig
from pipeline.llm.chunker import SpeakableChunker
from pipeline.llm.speakable import FenceFilter, clean
from pipeline.persona.persona import SpeechRules


def chunks(text: str, step: int = 1, **config) -> list[str]:
    """Feeds ``text`` in pieces of ``step`` characters (1 = the worst case: every boundary split)."""
    chunker = SpeakableChunker(ChunkerConfig(**config) if config else None)
    out = []
    for i in range(0, len(text), step):
        out += chunker.feed(text[i:i + step])
    return out + chunker.flush()


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_first_chunk_short_later_chunks_longer(step):
    text = ("Sure, I can help with that. The museum opens at nine in the morning and closes at six. "
            "Tickets cost twelve euros for adults. Children under twelve go in for free.")
    out = chunks(text, step, first_max_words=8)
    assert out[0] == "Sure, I can help with that."
    assert all(len(c.split()) >= 6 for c in out[1:-1])
    assert " ".join(out) == text


@pytest.mark.parametrize("step", [1, 1000])
def test_later_chunks_grow_step_by_step(step):
    """No long second chunk: each is at most twice the one before (3, 6, 12, 24, then 30 words), so TTS
    has it ready while the previous one plays."""
    text = " ".join(f"word{i}" for i in range(120)) + "."
    out = chunks(text, step)
    assert [len(c.split()) for c in out[:6]] == [3, 6, 12, 24, 30, 30]
    assert " ".join(out) == text


@pytest.mark.parametrize("text", [
    "Pi is roughly 3.14159 and e is about 2.71828 in most textbooks.",
    "Bring snacks, e.g. apples or nuts, and water, i.e. at least a litre.",
    "Dr. Smith met Mr. Jones at 5 p.m. on Main St. near the park yesterday.",
    "It costs $1,299.99 today, which is 12.5 percent off the usual price.",
])
def test_never_splits_inside_numbers_or_abbreviations(text):
    out = chunks(text, 1, first_min_words=1, min_words=1)
    joined = " ".join(out)
    assert joined == text
    for before, after in zip(out, out[1:]):  # no cut inside "3.14" or after "e.g.", "Dr.", "p.m." ...
        assert before.split()[-1] not in {"e.g.", "i.e.", "Dr.", "Mr.", "St.", "p.m."}
        assert not (before[-1] == "." and before[-2].isdigit() and after[0].isdigit())


def test_etc_ends_a_sentence_before_a_capital():
    out = chunks("Okay. We have apples and plums etc. and pears etc. Then we have nuts.", 1,
                 first_min_words=1, first_max_words=5, min_words=1)
    assert out == ["Okay.", "We have apples and plums etc. and pears etc.", "Then we have nuts."]


def test_first_chunk_is_cut_after_a_few_words_even_without_punctuation():
    out = chunks("Well I think the answer you are looking for is probably forty two", 1)
    assert len(out[0].split()) == ChunkerConfig().first_max_words


def test_the_first_chunk_is_three_words_or_a_clause_of_two():
    """What the user waits for is the first chunk's tokens and its synthesis: it is kept short."""
    assert chunks("The capital of France is Paris.")[0] == "The capital of"
    assert chunks("Of course, here is a tip for you.")[0] == "Of course,"
    assert chunks("Sure, here is a tip.")[0] == "Sure, here is"  # one word before the comma: too short alone


def test_markdown_code_emoji_and_urls_are_not_spoken():
    text = ("## Answer\nHere is **bold** and *italic* text 😀 with a [link](https://x.org/a).\n"
            "- first item\n- second item\n```python\nprint('never read this')\n```\n"
            "See https://example.com/docs?q=1 for more 🚀 details.")
    out = chunks(text, 2)
    spoken = " ".join(out)
    for bad in ("#", "*", "`", "print", "http", "example.com", "😀", "🚀", "[", "]("):
        assert bad not in spoken, bad
    assert "Here is bold and italic text with a link." in spoken
    assert "first item," in out and "second item," in out  # spoken as a list


def test_rules_can_keep_markup():
    rules = SpeechRules(strip_markdown=False, strip_emoji=False, strip_urls=False)
    assert clean("**hi** 😀 https://a.b", rules) == "**hi** 😀 https://a.b"


def test_fence_split_across_deltas():
    fences = FenceFilter()
    out = "".join(fences.feed(piece) for piece in ["Before ``", "`co", "de here`", "``", " after"]) + fences.flush()
    assert out == "Before  after"


def test_only_emoji_or_punctuation_makes_no_chunk():
    assert chunks("😀🚀 ... !!") == []


def test_flush_emits_the_unfinished_tail():
    chunker = SpeakableChunker()
    assert chunker.feed("No final punctuation") == []
    assert chunker.flush() == ["No final punctuation"]


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_a_number_the_answer_ends_on_is_spoken_after_a_cut(step):
    """A chunk that starts with "3. " is a list marker only where a line or a sentence starts: here the
    first chunk ends after three words and the next one starts with the answer itself."""
    assert " ".join(chunks("The answer is 3. You can count them.", step)) == "The answer is 3. You can count them."
    assert " ".join(chunks("Half of fifty: 25. Easy.", step)) == "Half of fifty: 25. Easy."


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_markdown_lists_models_wrote_are_spoken_as_plain_sentences(step):
    """Answers Qwen2.5-0.5B and SmolLM2-135M gave to `bench answers`: no asterisk (split bold), no list
    number read aloud, items without punctuation spoken as a list, not run together."""
    qwen = ("1. **Create a relaxing routine**: Start with a simple daily routine.\n"
            "2. **Limit screen time**: Put your phone away an hour before bed.\n3. **Exercise regularly**")
    spoken = " ".join(chunks(qwen, step))
    assert spoken == ("Create a relaxing routine: Start with a simple daily routine. Limit screen time: Put your "
                      "phone away an hour before bed. Exercise regularly")
    smollm = "1. Brew your own tea with hot water from the kettle and wait. 2. Pour it into a cup. 3. Enjoy!"
    assert " ".join(chunks(smollm, step)) == \
        "Brew your own tea with hot water from the kettle and wait. Pour it into a cup. Enjoy!"
    assert " ".join(chunks("Three colours:\n1. Red\n2. Orange\n3. Yellow", step)) == "Three colours: Red, Orange, Yellow"
    assert " ".join(chunks("## Tips\n- sleep\n- eat", step)) == "Tips. sleep, eat"
    assert " ".join(chunks("Nine squared is 9 * 9 = 81.", step)) == "Nine squared is 9 times 9 = 81."
