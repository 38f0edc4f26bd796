"""Everyday questions for a voice assistant, each with rules a program can check.

A question passes when every ``require`` pattern matches the answer (each pattern lists the
accepted spellings: digits or words, synonyms), at least ``at_least`` of the ``some_of`` patterns
match, and no ``forbid`` pattern matches, nor one of ``ALWAYS_FORBIDDEN`` (an answer stuck in a
loop). Patterns are case-insensitive regular expressions. The rules accept any correct phrasing we
could think of and reject the wrong answers small models actually gave (SmolLM2-135M: "720
minutes" for two hours, blue and yellow make "blue"; Qwen2.5-0.5B: "sunscreen, sunscreen, ...").

Kinds: ``fact``, ``math`` (arithmetic and unit conversions), ``instruction`` (do a small spoken
task), ``yes/no``, ``format`` (a request that invites a list, answered as speech: no markdown).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# Markdown or list layout in an answer meant to be spoken: bullets, numbered lines, headings,
# emphasis, code.
MARKDOWN = r"(^|\n)\s*([-*\u2022]\s|\d+[.)]\s|#)|\*\*|__|`"
# The same word or words four times in a row: a model looping until max_tokens is not an answer,
# even when the loop holds the right word.
REPEATS = r"\b(\w+(?:\W+\w+){0,3}?)(?:\W+\1\b){3}"
ALWAYS_FORBIDDEN = (REPEATS,)
# "There is no set answer ... depends on your personal interpretation" to a question that has one.
HEDGE = r"\bno (set|single|simple|definitive|fixed) answer\b"

_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
         "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def _words(n: int) -> str:
    """A regex for ``n`` (0..9999) in words: "one hundred (and) twenty", "a hundred twenty", "twenty-four"."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + (rf"[- ]{_ONES[ones]}" if ones else "")
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        head = rf"(?:{_ONES[hundreds]}|a)" if hundreds == 1 else _ONES[hundreds]
        return rf"{head} hundred" + (rf"(?: and)? {_words(rest)}" if rest else "")
    thousands, rest = divmod(n, 1000)
    head = rf"(?:{_ONES[thousands]}|a)" if thousands == 1 else _words(thousands)
    return rf"{head} thousand" + (rf"(?: and)? {_words(rest)}" if rest else "")


def number(n: int) -> str:
    """A pattern for the number ``n`` as digits (with or without a thousands comma) or in words."""
    digits = f"{n:,}".replace(",", ",?") if n >= 1000 else str(n)
    return rf"(?<![\d.]){digits}(?![\d]|\.\d)|\b{_words(n)}\b"


@dataclass(frozen=True)
class Question:
    """One question and the rules its answer is scored by."""

    text: str
    kind: str
    require: tuple[str, ...] = ()
    forbid: tuple[str, ...] = ()
    some_of: tuple[str, ...] = ()
    at_least: int = 0
    spoken: bool = False  # also asked as Piper audio through the whole voice pipeline

    def failures(self, answer: str) -> list[str]:
        """Why ``answer`` fails (empty when it passes)."""
        reasons = [f"missing /{p}/" for p in self.require if not re.search(p, answer, re.I)]
        reasons += [f"has /{p}/" for p in self.forbid + ALWAYS_FORBIDDEN if re.search(p, answer, re.I)]
        found = sum(bool(re.search(p, answer, re.I)) for p in self.some_of)
        if found < self.at_least:
            reasons.append(f"{found} of the expected items, want {self.at_least}")
        if not answer.strip():
            reasons.append("empty answer")
        return reasons


def claim(subject: str, predicate: str) -> str:
    """A pattern for "``subject`` ... ``predicate``" with at most three words between and none of
    them a negation: "the sun is indeed a star", not "the sun is not a star"."""
    return rf"{subject} (?:(?!not\b|never\b)[\w-]+ ){{0,3}}{predicate}"


def _yes(text: str, says_so: str, spoken: bool = False) -> Question:
    """A yes question: "yes" (or "of course", "indeed" ...) or a statement of the fact (``says_so``:
    "The capital of Japan is Tokyo." answers "Is Tokyo the capital of Japan?")."""
    return Question(text, "yes/no", (rf"\byes\b|\b(of course|certainly|indeed|correct|that's right|absolutely)\b|"
                                     rf"{says_so}",), (r"^\W*(no|not)\b",), spoken=spoken)


def _no(text: str, says_so: str, *wrong: str, spoken: bool = False) -> Question:
    """A no question: a negation, or a statement of the truth (``says_so``: "A whale is a mammal."),
    and none of the ``wrong`` claims ("No, the moon is much larger")."""
    return Question(text, "yes/no", (rf"\bno\b|\bnot\b|n't\b|\bcannot\b|\bnever\b|{says_so}",),
                    (r"^\W*(yes|of course|certainly|indeed|absolutely)\b",) + wrong, spoken=spoken)


def _listless(text: str, some_of: tuple[str, ...], at_least: int, spoken: bool = False) -> Question:
    return Question(text, "format", forbid=(MARKDOWN,), some_of=some_of, at_least=at_least, spoken=spoken)


QUESTIONS: tuple[Question, ...] = (
    # ---- facts ----
    Question("What is the capital of France?", "fact", (r"\bparis\b",), spoken=True),
    Question("What is the capital of Japan?", "fact", (r"\btokyo\b",)),
    Question("What is the capital of Australia?", "fact", (r"\bcanberra\b",)),
    Question("What is the capital of Canada?", "fact", (r"\bottawa\b",)),
    Question("Who wrote Romeo and Juliet?", "fact", (r"shakespeare",), spoken=True),
    Question("What colour do you get when you mix blue and yellow?", "fact", (r"\bgreen\b",), spoken=True),
    Question("What is the largest planet in our solar system?", "fact", (r"\bjupiter\b",)),
    Question("How many legs does a spider have?", "fact", (number(8),)),
    Question("At what temperature does water boil, in degrees Celsius?", "fact", (number(100),)),
    Question("Which planet is known as the red planet?", "fact", (r"\bmars\b",)),
    Question("What is the chemical symbol for gold?", "fact", (r"\bAu\b",)),
    Question("Who painted the Mona Lisa?", "fact", (r"leonardo|da vinci",),
             (r"botticelli|michelangelo|raphael|rembrandt|picasso|van gogh",)),
    Question("How many days are there in a leap year?", "fact", (number(366),)),
    Question("What is the largest ocean on Earth?", "fact", (r"\bpacific\b",)),
    Question("How many continents are there?", "fact", (number(7),)),
    Question("What language do people speak in Brazil?", "fact", (r"portuguese",)),
    Question("What is the tallest mountain in the world?", "fact", (r"everest",)),
    Question("Who was the first person to walk on the moon?", "fact", (r"armstrong",), spoken=True),
    Question("Which gas do plants take in from the air to make their food?", "fact", (r"carbon dioxide|\bco[2\u2082]",)),
    Question("How many hours are there in a day?", "fact", (number(24),), (HEDGE,)),
    Question("What is the opposite of hot?", "fact", (r"\bcold\b",)),
    Question("What do bees make?", "fact", (r"\bhoney\b",)),
    # ---- arithmetic and unit conversions ----
    Question("What is seven times eight?", "math", (number(56),), spoken=True),
    Question("How many minutes are there in two hours?", "math", (number(120),), (number(720),), spoken=True),
    Question("What is fifteen plus twenty-seven?", "math", (number(42),)),
    Question("What is one hundred minus thirty-seven?", "math", (number(63),)),
    Question("What is half of fifty?", "math", (number(25),)),
    Question("How many centimetres are there in a metre?", "math", (number(100),)),
    Question("How many grams are there in a kilogram?", "math", (number(1000),)),
    Question("How many seconds are there in a minute?", "math", (number(60),)),
    Question("What is twelve divided by four?", "math", (number(3),)),
    Question("How many days are there in a week?", "math", (number(7),)),
    Question("What is nine squared?", "math", (number(81),)),
    Question("How many months are there in a year?", "math", (number(12),), (HEDGE,)),
    Question("What is twenty percent of fifty?", "math", (number(10),), (rf"(?:{number(10)}) ?(%|percent)",)),
    Question("How many minutes are there in a quarter of an hour?", "math", (number(15),)),
    Question("I have three apples and I eat one. How many apples do I have left?", "math", (number(2),)),
    Question("How many inches are there in a foot?", "math", (number(12),)),
    Question("What is three plus four?", "math", (number(7),), spoken=True),
    # ---- short spoken tasks ----
    Question("Say hello to my friend Maria.", "instruction", (r"\b(hello|hi|hey)\b", r"\bmaria\b"),
             (r"magical|creature",), spoken=True),
    Question("Wish my sister Anna a happy birthday.", "instruction", (r"happy birthday", r"\banna\b")),
    Question("Say thank you to my colleague Tom.", "instruction", (r"\bthank", r"\btom\b")),
    Question("Count from one to five.", "instruction",
             # "1, 2, 3, 4 and 5", or as a list: "1. One\n2. Two ..." (spoken "One, Two, ...")
             (r"\W+(?:and\W+)?(?:\d[.)]\s*)?".join(("(1|one)", "(2|two)", "(3|three)", "(4|four)", "(5|five)")),),
             spoken=True),
    Question("Spell the word cat.", "instruction", (r"\bc\W+a\W+t\b",)),
    Question("Repeat after me: the sun is shining.", "instruction", (r"the sun is shining",)),
    Question("Give me a word that rhymes with cat.", "instruction",
             (r"\b(hat|bat|mat|rat|sat|fat|pat|chat|flat|vat|gnat|spat|brat|splat|scat)\b",)),  # not "that": any filler has it
    Question("How do you say thank you in Spanish?", "instruction", (r"gracias",)),
    Question("How do you say hello in French?", "instruction", (r"bonjour|salut",)),
    Question("Name a fruit that is yellow.", "instruction", (r"banana|lemon|pineapple|mango|grapefruit",)),
    Question("Say good night.", "instruction", (r"good[ -]?night",)),
    # ---- yes or no ----
    _yes("Is the sun a star?", claim(r"\bsun is", r"star\b"), spoken=True),
    _no("Is a whale a fish?", r"\bmammals?\b"),
    _no("Can penguins fly?", r"\bflightless\b|\bunable to fly\b"),
    _no("Is Paris in Italy?", r"\bfrance\b"),
    _yes("Is seven an odd number?", claim(r"\b(seven|7) is", r"odd\b")),
    _no("Is the moon bigger than the Earth?", r"\bsmaller\b", claim(r"\bmoon is", r"(bigger|larger)\b")),
    _no("Do spiders have six legs?", rf"(?:{number(8)}) legs"),
    _yes("Is Tokyo the capital of Japan?", claim(r"\btokyo is", r"capital\b") + r"|capital (city )?of japan is tokyo"),
    _yes("Is ten greater than three?", claim(r"\b(ten|10) is", r"(greater|bigger|larger|more)\b")),
    _yes("Does the Earth go around the Sun?", claim(r"\bearth", r"(goes|orbits|revolves|travels|moves|circles)\b"),
         spoken=True),
    # ---- a list-shaped request, answered as speech ----
    _listless("Give me three tips for sleeping better.", (r"\bsleep", r"\bbed", r"screen|phone|caffeine|coffee|dark"), 2,
              spoken=True),
    _listless("Name three colours of the rainbow.",
              tuple(rf"\b{c}\b" for c in ("red", "orange", "yellow", "green", "blue", "indigo", "violet")), 3),
    _listless("What are the steps to boil an egg?", (r"\bwater\b", r"\bboil", r"minute"), 2),
    _listless("Name four animals that live on a farm.",
              tuple(rf"\b{a}s?\b" for a in ("cow", "pig", "sheep", "horse", "chicken", "goat", "duck", "hen", "cattle",
                                           "turkey", "(?:goose|geese)", "donkey", "rabbit", "dog", "cat")), 3),
    _listless("How do I make a cup of tea?", (r"\bwater\b", r"\btea ?bag|\btea leaves|\bleaves\b", r"\bboil|\bkettle|\bhot"), 2),
    _listless("What should I pack for a day at the beach?",
              (r"sunscreen|sun ?cream|sunblock", r"towel", r"\bwater\b", r"\bhats?\b", r"sunglasses", r"swim",
              r"snack|sandwich|\bfood\b"), 2),  # "hat" was found in "what" and "that"
)
