"""``voxlane bench answers``: the scoring rules on answers small models really gave, and the
``--quick`` run through the real pipeline (text and spoken) on the configured model. The run's
scores are reported (printed), not held to a threshold: it is a measurement, not a gate."""
from __future__ import annotations

import json
import re

from bench.answer_set import MARKDOWN, QUESTIONS, number
from bench.answers import main, pick_questions


def question(text: str):
    return next(q for q in QUESTIONS if q.text == text)


def test_the_set_is_large_varied_and_has_a_spoken_subset():
    assert len(QUESTIONS) >= 60
    assert {q.kind for q in QUESTIONS} == {"fact", "math", "instruction", "yes/no", "format"}
    assert len({q.text for q in QUESTIONS}) == len(QUESTIONS)
    assert sum(q.spoken for q in QUESTIONS) >= 10
    quick = pick_questions(quick=True)
    assert len(quick) == 5 and {q.kind for q in quick} == {q.kind for q in QUESTIONS}


def test_numbers_are_accepted_as_digits_or_words_and_not_inside_other_numbers():
    for n, text in [(120, "Two hours is 120 minutes."), (120, "one hundred and twenty minutes"),
                    (120, "a hundred twenty"), (1000, "1,000 grams"), (1000, "a thousand grams"),
                    (25, "twenty-five"), (56, "fifty six"), (3, "It is 3.")]:
        assert re.search(number(n), text, re.I), (n, text)
    for n, text in [(3, "It is 3.5"), (7, "17 days"), (12, "112"), (8, "eighty")]:
        assert not re.search(number(n), text, re.I), (n, text)


def test_rules_pass_right_answers_and_fail_the_wrong_ones_small_models_gave():
    # SmolLM2-135M's answers quoted in issue 14, and what a good answer sounds like.
    assert question("How many minutes are there in two hours?").failures("That is 720 minutes.")
    assert not question("How many minutes are there in two hours?").failures("Two hours is 120 minutes.")
    assert question("What colour do you get when you mix blue and yellow?").failures(
        "A brilliant shade of blue with a slight tint of pink.")
    assert not question("What colour do you get when you mix blue and yellow?").failures("You get green.")
    assert question("Say hello to my friend Maria.").failures("Maria is a magical creature. Hello!")
    assert not question("Say hello to my friend Maria.").failures("Hello Maria! How are you?")
    assert question("Is a whale a fish?").failures("Yes, a whale is a big fish.")
    assert not question("Is a whale a fish?").failures("No, a whale is a mammal, not a fish.")
    tips = question("Give me three tips for sleeping better.")
    assert tips.failures("1. **Go to bed early**\n2. Avoid screens")
    assert not tips.failures("Go to bed at the same time, keep your bedroom dark, and skip coffee after lunch.")
    assert re.search(MARKDOWN, "- one\n- two") and not re.search(MARKDOWN, "It is 10 p.m. - late.")


def test_rules_are_fair_to_answers_the_full_runs_gave():
    """Verdicts the rules got wrong on the first full runs (SmolLM2-135M, Qwen2.5-0.5B), now right."""
    right = [  # right answers the first rules failed
        ("Is Tokyo the capital of Japan?", "The capital of Japan is Tokyo."),
        ("Does the Earth go around the Sun?", "The Earth goes around the Sun!"),
        ("Is Paris in Italy?", "Paris is indeed located in France."),
        ("Is a whale a fish?", "A whale is indeed a mammal that belongs to the order Cetacea."),
        ("Do spiders have six legs?", "No, spiders don't have six legs. They're actually arachnids."),
        ("Can penguins fly?", "Penguins cannot fly."),
        ("Count from one to five.", "1. One\n2. Two\n3. Three\n4. Four\n5. Five"),
        ("Count from one to five.", "One to five is 1, 2, 3, 4, and 5."),
        ("Name four animals that live on a farm.", "A cow, a dog, a cat, and a bird."),
        ("Say good night.", "Good-night!"),
    ]
    wrong = [  # wrong answers the first rules accepted
        ("What is twenty percent of fifty?", "Twenty percent of fifty is 10% of 50."),
        ("Give me a word that rhymes with cat.", 'The word that rhymes with cat is "cat."'),
        ("What should I pack for a day at the beach?", "A swimsuit, sunscreen, " + "sunscreen, " * 6),
        ("Is the moon bigger than the Earth?", "The answer is no, the moon is actually much larger than the Earth."),
        ("Who painted the Mona Lisa?", "The Mona Lisa by Leonardo da Vinci is attributed to Botticelli."),
        ("How many hours are there in a day?", "There is no set answer for that question. Days are divided into 24 hours."),
        ("Is the sun a star?", "The sun is not a star."),
    ]
    for text, answer in right:
        assert not question(text).failures(answer), (text, answer)
    for text, answer in wrong:
        assert question(text).failures(answer), (text, answer)
    assert not question("What is twenty percent of fifty?").failures("Twenty percent of fifty is 10.")
    assert not question("Is the sun a star?").failures("Yes, the sun is a medium-sized star.")
    assert not question("What should I pack for a day at the beach?").failures("A hat, a towel and water.")


def test_quick_run_through_the_pipeline_reports_scores_and_answers(capsys):
    assert main(["--quick", "--spoken", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    by_mode = {s["mode"]: s for s in report["scores"]}
    assert by_mode["text"]["asked"] == 5 and 0.0 <= by_mode["text"]["score"] <= 1.0
    assert by_mode["spoken"]["asked"] == sum(q.spoken for q in pick_questions(quick=True))
    text_answers = next(a for key, a in report["answers"].items() if key.endswith("(text)"))
    assert all(a["answer"] and not a["answer"].startswith("[") for a in text_answers)  # real answers, no errors
    spoken = next(a for key, a in report["answers"].items() if key.endswith("(spoken)"))
    assert all(a["heard"] for a in spoken)  # Whisper heard every spoken question
    print(json.dumps(report["scores"]))  # the scores, for the log: reported, not asserted
