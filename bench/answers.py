"""``voxlane bench answers``: does the assistant answer everyday questions correctly?

    voxlane bench answers [--models smollm2-135m-instruct,qwen2.5-0.5b-instruct] [--quick] [--spoken] [--json]

Each question of ``bench.answer_set`` is asked through the real pipeline's text path (a fresh
conversation with the persona's system prompt and speech rules, the LLM stage, the speakable
chunker, Piper) and its answer is scored by the question's rules. ``--spoken`` also asks the
questions marked ``spoken`` as Piper audio through the whole voice pipeline (VAD, Whisper, LLM,
TTS) and scores what it answered to what it heard. Greedy decoding (temperature 0, the persona's
other settings kept) so that runs compare; per model: the score, by kind, the median time from the
question to the first token and to the first audio, and every answer with why it failed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from dataclasses import dataclass, field

from bench.answer_set import QUESTIONS, Question

QUICK_COUNT = 5  # --quick: the first question of each kind (five kinds), then more until this many


@dataclass
class Answer:
    """One asked question: what came back and how it scored."""

    question: str
    kind: str
    answer: str
    failures: list[str]
    first_token_ms: float | None
    first_audio_ms: float | None
    heard: str | None = None  # the transcript, when asked by voice

    @property
    def is_correct(self) -> bool:
        return not self.failures


@dataclass
class ModelScore:
    """A model's answers to the set, asked one way (text or spoken)."""

    model: str
    mode: str  # "text" | "spoken"
    answers: list[Answer] = field(default_factory=list)

    def summary(self) -> dict:
        correct = [a for a in self.answers if a.is_correct]
        kinds = sorted({a.kind for a in self.answers})
        firsts = [a.first_token_ms for a in self.answers if a.first_token_ms is not None]
        audios = [a.first_audio_ms for a in self.answers if a.first_audio_ms is not None]
        return {
            "model": self.model, "mode": self.mode, "correct": len(correct), "asked": len(self.answers),
            "score": round(len(correct) / len(self.answers), 3) if self.answers else 0.0,
            "by_kind": {k: f"{sum(a.is_correct for a in self.answers if a.kind == k)}/"
                           f"{sum(a.kind == k for a in self.answers)}" for k in kinds},
            "median_first_token_ms": round(statistics.median(firsts)) if firsts else None,
            "median_first_audio_ms": round(statistics.median(audios)) if audios else None,
        }


def pick_questions(quick: bool) -> list[Question]:
    """All questions, or for ``--quick`` a few covering every kind (the suite's smoke run)."""
    if not quick:
        return list(QUESTIONS)
    picked: list[Question] = []
    for kind in dict.fromkeys(q.kind for q in QUESTIONS):
        picked.append(next(q for q in QUESTIONS if q.kind == kind))
    picked += [q for q in QUESTIONS if q not in picked][: max(0, QUICK_COUNT - len(picked))]
    return picked


def greedy(persona):
    """The persona with greedy decoding, so that scores do not move from run to run."""
    return dataclasses.replace(persona, sampling=dataclasses.replace(persona.sampling, temperature=0.0))


def ask_by_text(models, persona, question: Question, timeout_s: float) -> Answer:
    """One question typed into a fresh pipeline (text path: LLM stage, chunker, TTS)."""
    from pipeline.pipeline import Pipeline

    with Pipeline(llm=models.llm, tts=models.tts, personas=persona) as pipeline:
        gen = pipeline.text_input(question.text)
        text, waterfall = _collect_turn(pipeline, gen, timeout_s)
    return Answer(question.text, question.kind, text, question.failures(text),
                  after_origin_ms(waterfall, "llm_first_token"), after_origin_ms(waterfall, "first_audio_out"))


def _collect_turn(pipeline, gen: int, timeout_s: float) -> tuple[str, dict]:
    from pipeline.frames import AssistantDone, ErrorFrame, TurnDone

    text, deadline = "", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        frame = pipeline.next_frame(0.1)
        if frame is None or frame.gen != gen:
            continue
        if isinstance(frame, AssistantDone):
            text = frame.text
        elif isinstance(frame, ErrorFrame):
            text = f"[error: {frame.message}]"
        elif isinstance(frame, TurnDone):
            return text, frame.waterfall
    return text or "[no answer in time]", {}


def after_origin_ms(waterfall: dict, mark: str) -> float | None:
    """Milliseconds from the turn's origin (the typed text, or the end of speech) to ``mark``."""
    return waterfall.get("ms", {}).get(mark)


def run_model(spec: str, questions: list[Question], persona_name: str, spoken: bool, timeout_s: float,
              log) -> list[ModelScore]:
    """Load ``spec`` (and the voice models), ask every question; the text score and, with
    ``spoken``, the spoken one."""
    from app.config import load_config
    from app.voice_models import load_voice_models
    from pipeline.persona.store import PersonaStore

    config = load_config()
    config = dataclasses.replace(config, models=dataclasses.replace(config.models, llm=spec))
    models = load_voice_models(config)
    try:
        models.warm_up()
        persona = greedy(PersonaStore().get(persona_name))
        text = ModelScore(spec, "text")
        for i, question in enumerate(questions, 1):
            text.answers.append(ask_by_text(models, persona, question, timeout_s))
            log(f"  {spec} {i}/{len(questions)} {'ok ' if text.answers[-1].is_correct else 'BAD'} "
                f"{question.text} -> {text.answers[-1].answer!r}")
        scores = [text]
        if spoken:
            from bench.spoken_answers import ask_by_voice

            voice = ModelScore(spec, "spoken")
            for question in (q for q in questions if q.spoken):
                voice.answers.append(ask_by_voice(models, config, persona, question, timeout_s))
                log(f"  {spec} spoken {'ok ' if voice.answers[-1].is_correct else 'BAD'} "
                    f"heard {voice.answers[-1].heard!r} -> {voice.answers[-1].answer!r}")
            scores.append(voice)
        return scores
    finally:
        models.close()


def print_report(scores: list[ModelScore], show_answers: bool) -> None:
    print(f"{'model':26} {'mode':6} {'correct':>9} {'score':>6} {'1st token ms':>12} {'1st audio ms':>12}  by kind")
    for score in scores:
        s = score.summary()
        print(f"{s['model']:26} {s['mode']:6} {s['correct']:>4}/{s['asked']:<4} {s['score']:>6.2f} "
              f"{s['median_first_token_ms'] or '':>12} {s['median_first_audio_ms'] or '':>12}  "
              + ", ".join(f"{k} {v}" for k, v in s["by_kind"].items()))
    if show_answers:
        for score in scores:
            print(f"\n## {score.model} ({score.mode})")
            for a in score.answers:
                mark = "ok " if a.is_correct else "BAD"
                heard = f" [heard: {a.heard}]" if a.heard is not None else ""
                print(f"{mark} {a.question}{heard}\n    -> {a.answer}")
                if a.failures:
                    print(f"    ({'; '.join(a.failures)})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="voxlane bench answers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=None,
                        help="comma-separated LLM specs (default: the config's LLM and the other packaged ones "
                             "installed: smollm2-135m-instruct, qwen2.5-0.5b-instruct, qwen2.5-1.5b-instruct)")
    parser.add_argument("--persona", default="nova", help="persona whose prompt and speech rules are used")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_COUNT} questions, one model (the suite's run)")
    parser.add_argument("--spoken", action="store_true", help="also ask the spoken subset as Piper audio")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="per question")
    parser.add_argument("--no-answers", action="store_true", help="print the table only")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    specs = args.models.split(",") if args.models else default_models(args.quick)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    questions = pick_questions(args.quick)
    scores: list[ModelScore] = []
    for spec in specs:
        log(f"{spec}: {len(questions)} questions")
        scores += run_model(spec, questions, args.persona, args.spoken, args.timeout_s, log)
    if args.json:
        print(json.dumps({"scores": [s.summary() for s in scores],
                          "answers": {f"{s.model} ({s.mode})": [dataclasses.asdict(a) for a in s.answers]
                                      for s in scores}}, indent=1))
    else:
        print_report(scores, not args.no_answers)
    return 0


def default_models(quick: bool) -> list[str]:
    """The configured LLM (alone with --quick), then every other packaged LLM that is installed."""
    from app import model_store
    from app.config import load_config

    configured = load_config().models.llm
    if quick:
        return [configured]
    others = [name for name, m in model_store.PACKAGED.items() if m.kind == "llm" and name != configured
              and model_store.is_installed(name)]
    return [configured] + others


if __name__ == "__main__":
    sys.exit(main())
