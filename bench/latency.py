"""``voxlane bench latency``: spoken questions through the whole pipeline, p50/p95 per stage.

    voxlane bench latency [--repeat 2] [--barge-in 3] [--json]

Each question is synthesized (Piper by default), fed in real time to a fresh session, and timed
from the true end of speech in the input (by energy, not by the VAD under test) to the first
assistant audio sample sent to the speaker. The machine is shared: figures are medians, and the
load average is printed with them.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys

import numpy as np

from app.commands.converse import add_model_arguments, app_config, load_models, make_pipeline, pick_persona
from app.scripted_user import InputAudio, ScriptedUser
from pipeline.persona.persona import Persona

QUESTIONS = (
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Can you recommend a good book to read?",
    "What should I cook for dinner tonight?",
    "Why is the sky blue?",
    "Tell me a fun fact about cats.",
    "What is the weather usually like in spring?",
    "How do I make a cup of tea?",
    "What is your name?",
    "Give me a tip for sleeping better.",
)
REUSED = ("asr_final_reused", "text_probe_reused", "early_answer_adopted")  # work ready at the pause (counts)
STAGES = ("turn_end_detected", "asr_final", "last_word_timed", "llm_first_token", "first_chunk_ready", "first_audio_ready",
          "first_audio_out")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(values: list[float]) -> dict:
    return {"n": len(values), "p50": round(percentile(values, 50), 1), "p95": round(percentile(values, 95), 1),
            "mean": round(statistics.fmean(values), 1) if values else None}


def synthesize(texts: tuple[str, ...], models, voice) -> list[InputAudio]:
    """The user's questions in ``voice``, the same audio every run (no sampled variation), so runs
    and arms compare on equal input."""
    tts = models.tts(dataclasses.replace(voice, variation=0.0))
    return [InputAudio(np.concatenate(list(tts.synthesize(t, 1.0))), tts.sample_rate, 1) for t in texts]


def end_session(models, session: str) -> None:
    """Frees the engine's per-session KV slot (backends without sessions have no such method)."""
    end = getattr(models.llm, "end_session", None)
    if end is not None:
        end(session)


def turn_figures(turn, text: str) -> dict:
    from bench.wer import word_errors

    ms = turn.waterfall.get("ms", {})
    errors, num_words = word_errors(text, turn.user)
    counts = turn.waterfall.get("counts", {})
    return {"question": text, "heard": turn.user, "voice_to_voice_ms": turn.voice_to_voice_ms, "ms": ms,
            "reused": {name: bool(counts.get(name)) for name in REUSED},
            "word_errors": errors, "words": num_words, "early_asr": "asr_final" in ms and
            ms.get("asr_final", 0) < ms.get("turn_end_detected", 0)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="voxlane bench latency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs of the question set")
    parser.add_argument("--questions", type=int, default=len(QUESTIONS), help="how many of the built-in questions")
    parser.add_argument("--barge-in", type=int, default=0, metavar="N", help="also measure N barge-ins")
    parser.add_argument("--json", action="store_true")
    add_model_arguments(parser)
    parser.set_defaults(temperature=0.0, max_tokens=40)
    args = parser.parse_args(argv)
    config = app_config(args)
    models = load_models(config)
    personas = pick_persona(args, config)
    persona: Persona = personas if isinstance(personas, Persona) else personas.get(config.personas.default)
    models.warm_up([persona.voice])
    texts = QUESTIONS[: args.questions]
    inputs = synthesize(texts, models, persona.voice)
    turns = []
    try:
        for run in range(args.repeat):
            for index, (text, audio) in enumerate(zip(texts, inputs)):
                # A new conversation each time: its first turn prefills the whole prompt (the worst case).
                session = f"bench-{run}-{index}"
                pipeline = make_pipeline(models, personas, config.personas.default, config.pipeline, session=session)
                try:
                    result = ScriptedUser(pipeline).run([audio], is_last_played=False)
                finally:
                    pipeline.close()
                    end_session(models, session)
                if result.turns:
                    turns.append(turn_figures(result.turns[0], text))
                    if not args.json:
                        t = turns[-1]
                        print(f"  {t['voice_to_voice_ms']:>7} ms  {text!r} -> {t['heard']!r}", file=sys.stderr)
        barge = measure_barge_in(models, personas, config.personas.default, config.pipeline, persona, args.barge_in)
    finally:
        models.close()
    data = report(turns, barge, args, config)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print_report(data)
    return 0


STORY_MAX_TOKENS = 400  # the story must still be generating when the user speaks over it


def measure_barge_in(models, personas, persona_name, config, persona, count: int) -> dict:
    """Barge-ins over a long story: when playback stopped, when the VAD heard the user, and how
    long after the interrupt the LLM generation ended. The story gets its own answer length: with
    the question runs' short answers (--max-tokens 40) the generation had always ended before the
    user spoke, and there was nothing to cancel (the old report printed "p50 nan")."""
    if count <= 0:
        return {}
    story, stop = synthesize(("Tell me a long story about a brave little dragon.", "Stop, please."), models,
                             persona.voice)
    storyteller = dataclasses.replace(persona, sampling=dataclasses.replace(persona.sampling,
                                                                            max_tokens=STORY_MAX_TOKENS))
    stops, detects, cancels, ended_before = [], [], [], 0
    for _ in range(count):
        pipeline = make_pipeline(models, storyteller, persona_name, config, session="bench-barge-in")
        end_session(models, "bench-barge-in")
        try:
            result = ScriptedUser(pipeline).run([story, stop], barge_in_at_s=0.5, is_last_played=False)
            first = result.turns[0].gen if result.turns else None
            marks = pipeline.book.marks(first) if first is not None else {}
        finally:
            pipeline.close()
        stops += result.barge_in_stop_ms[:1]
        detects += result.barge_in_detect_ms[:1]
        if "interrupted" in marks and "llm_done" in marks:
            if marks["llm_done"] >= marks["interrupted"]:
                cancels.append(1000 * (marks["llm_done"] - marks["interrupted"]))
            else:
                ended_before += 1  # the whole story was written before the user spoke: nothing to cancel
    return {"stop_ms": summary(stops), "vad_detect_ms": summary(detects), "llm_cancel_ms": summary(cancels),
            "llm_ended_before_interrupt": ended_before, "samples": stops}


def report(turns: list[dict], barge: dict, args, config) -> dict:
    v2v = [t["voice_to_voice_ms"] for t in turns if t["voice_to_voice_ms"] is not None]
    stages = {name: summary([t["ms"][name] for t in turns if name in t["ms"]]) for name in STAGES}
    errors, words = sum(t["word_errors"] for t in turns), sum(t["words"] for t in turns)
    reused = {name: sum(t["reused"][name] for t in turns) for name in REUSED}
    return {"conditions": {"load_average": [round(x, 2) for x in os.getloadavg()], "cpu_count": os.cpu_count(),
                           "asr": config.models.asr, "llm": config.models.llm, "llm_backend": config.llm.backend,
                           "max_tokens": args.max_tokens, "partials": config.pipeline.asr.is_partial_enabled,
                           "pause_ms": config.pipeline.vad.pause_ms,
                           "answer_pause_ms": min(config.pipeline.vad.answer_pause_ms, config.pipeline.vad.pause_ms)},
            "voice_to_voice_ms": summary(v2v), "stages_ms_from_vad_speech_end": stages,
            "wer": round(errors / max(1, words), 4), "reused": reused, "turns": turns, "barge_in": barge}


def print_report(data: dict) -> None:
    c = data["conditions"]
    print(f"voice-to-voice latency ({data['voice_to_voice_ms']['n']} turns; {c['asr']}, {c['llm']} via "
          f"{c['llm_backend']}; load average {c['load_average']} on {c['cpu_count']} CPUs)")
    print(f"{'stage (ms after the VAD-detected end of speech)':<50} {'p50':>8} {'p95':>8}")
    for name, s in data["stages_ms_from_vad_speech_end"].items():
        print(f"  {name:<48} {s['p50']:>8} {s['p95']:>8}")
    v = data["voice_to_voice_ms"]
    print(f"  {'VOICE-TO-VOICE (true end of speech -> first audio)':<48} {v['p50']:>8} {v['p95']:>8}")
    print(f"ASR word error rate on the questions: {100 * data['wer']:.1f} %")
    n, reused = data["voice_to_voice_ms"]["n"], data["reused"]
    print(f"ready at the pause: final transcript in {reused['asr_final_reused']} of {n} turns, the words' "
          f"end-of-turn probe in {reused['text_probe_reused']}, the answer itself (started at a partial "
          f"with the same words) in {reused['early_answer_adopted']}")
    if data["barge_in"]:
        b = data["barge_in"]
        print(f"barge-in: playback stopped p50 {b['stop_ms']['p50']} / p95 {b['stop_ms']['p95']} ms of audio after "
              f"the interrupting speech began (n={b['stop_ms']['n']}; of which the VAD needed p50 "
              f"{b['vad_detect_ms']['p50']} ms of audio, the rest is processing)")
        cancel, before = b["llm_cancel_ms"], b["llm_ended_before_interrupt"]
        if cancel["n"]:
            print(f"  LLM generation ended p50 {cancel['p50']} / p95 {cancel['p95']} ms after the interrupt "
                  f"(n={cancel['n']})" + (f"; in {before} more run(s) it had ended before it" if before else ""))
        else:
            print(f"  LLM generation: nothing to cancel, it had ended before the interrupt in all {before} run(s)")
