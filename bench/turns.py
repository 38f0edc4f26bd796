"""``voxlane bench turns``: does the assistant wait through a thinking pause, and answer a finished
question fast? Per end-of-turn mode, on a labelled set built here (bench/turn_set.py).

    voxlane bench turns [--set dev|held-out|held-out-2|held-out-3] [--modes semantic,silence] [--sentences 24] [--json]

``--modes`` also takes ``semantic-no-last-word`` (semantic without the last-word check), for a
before/after of that check in one run, and ``semantic-timed-first`` (the final transcript sent only
once its last word is timed, as before that timing became a signal of its own), for a before/after
of that change: the same decisions, the answer no longer behind the alignment pass.

Each item is fed in real time to a fresh session, once per mode (alternating, so both modes see
the same machine load). Reported per mode:
- false cuts: paused items whose turn ended inside the pause (the fragment was answered); also
  among pauses of at most 1 s alone (the target's scope: "false cuts on mid-sentence pauses up to 1 s");
- missed ends: complete items that waited the long maximum (judged unfinished, or judged finished
  only after the long silence had passed: "late verdicts", a sign of an overloaded machine);
- voice to voice p50/p95 on complete items, from the true end of speech in the input (by energy,
  not the VAD under test) to the first assistant audio sample sent.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from app.commands.converse import add_model_arguments, app_config, load_models, make_pipeline, pick_persona
from app.scripted_user import InputAudio, ScriptedUser
from bench.latency import summary
from bench.turn_set import SETS, TurnItem, load_turn_set
from pipeline.audio import PIPELINE_RATE
from pipeline.frames import SpeechEnded
from pipeline.persona.persona import Persona

MODES = ("semantic", "silence")
# Variants a run can compare besides the modes: the persona's endpointing with these changes.
VARIANTS = {"semantic": {"mode": "semantic"}, "silence": {"mode": "silence"},
            "semantic-no-last-word": {"mode": "semantic", "is_last_word_checked": False},
            "semantic-timed-first": {"mode": "semantic"}}
# ... and these pipeline settings ([pipeline.asr] and so on)
PIPELINE_VARIANTS = {"semantic-timed-first": {"asr": {"is_last_word_timed_first": True}}}
CUT_MARGIN_SAMPLES = 1600  # a SpeechEnded within 100 ms after the pause is still "inside" it (VAD lateness)


def pipeline_config(config, mode: str):
    """The pipeline settings of ``mode`` (PIPELINE_VARIANTS over the app's)."""
    changes = PIPELINE_VARIANTS.get(mode, {})
    return dataclasses.replace(config.pipeline, **{section: dataclasses.replace(getattr(config.pipeline, section), **values)
                                                   for section, values in changes.items()})


def run_item(models, persona: Persona, config, item: TurnItem, session: str, pipeline_settings=None) -> dict:
    """One utterance through a fresh session; what happened to it."""
    pipeline = make_pipeline(models, persona, persona.key, pipeline_settings or config.pipeline, session=session)
    try:
        result = ScriptedUser(pipeline).run([InputAudio(item.audio)], is_last_played=False)
    finally:
        pipeline.close()
        end = getattr(models.llm, "end_session", None)
        if end is not None:
            end(session)
    ends = [f.at_sample for f in result.frames if isinstance(f, SpeechEnded)]
    lead_in = round(0.3 * 16000)  # ScriptedUser's silence before the input (16 kHz samples)
    cut = not item.is_complete and any(e <= lead_in + item.pause_end + CUT_MARGIN_SAMPLES for e in ends)
    last = result.turns[-1] if result.turns else None
    waited_ms = None
    if last is not None:
        ms = last.waterfall.get("ms", {})
        if "turn_end_detected" in ms:
            waited_ms = ms["turn_end_detected"]
    counts = last.waterfall.get("counts", {}) if last else {}
    p_complete = counts.get("p_complete")
    missed, late = end_outcome(item.is_complete, persona.endpointing, waited_ms, p_complete)
    # the signals of the first turn, for re-fusing offline: a cut item's are its fragment's (a paused
    # item that waited reports one turn, the resumed utterance, with the signals of its last pause)
    first = result.turns[0].waterfall.get("counts", {}) if result.turns else {}
    signals = {name: first.get(name) for name in ("p_audio", "p_text", "words_logprob", "last_word")}
    pause_ms = round(1000 * (item.pause_end - item.pause_start) / PIPELINE_RATE) if not item.is_complete else None
    return {"item": item.name, "voice": item.voice, "complete": item.is_complete, "noisy": item.is_noisy,
            "pause_ms": pause_ms,
            "turns": len(result.turns), "false_cut": cut, "missed_end": missed, "late_verdict": late,
            "last_word_late": bool(first.get("last_word_late") or counts.get("last_word_late")),
            "heard": last.user if last else "", "end_wait_ms": waited_ms,
            "voice_to_voice_ms": last.voice_to_voice_ms if last else None, "p_complete": p_complete,
            "first_pause": {"heard": result.turns[0].user if result.turns else "", **signals}}


def end_outcome(is_complete: bool, endpointing, waited_ms: float | None, p_complete: float | None) -> tuple[bool, bool]:
    """(missed end, late verdict) of an item in ``endpointing``'s mode. A finished question misses
    its end when it waited the long maximum: judged unfinished (that verdict always means the long
    silence, counted on the audio clock), or judged finished only after the long silence had passed
    on the wall clock (a late verdict: a busy machine). The wall clock alone undercounts the first
    kind: 08-flite-slt-complete (judged 0.25, its final read by the slow 30 s ASR fallback) ended
    1301-1308 ms after its last voiced frame was pushed, in two runs at load 3-5, and was counted
    as answered in time. Most likely a stage behind blocked push_audio (its queue is bounded),
    so that frame was pushed late and the scripted user caught up on its schedule afterwards."""
    if not is_complete or endpointing.mode != "semantic":
        return False, False
    waited_long = waited_ms is not None and waited_ms >= endpointing.long_silence_ms - 32
    judged_finished = p_complete is not None and p_complete >= endpointing.threshold
    judged_unfinished = p_complete is not None and not judged_finished
    return waited_long or judged_unfinished, waited_long and judged_finished


UP_TO_MS = 1000  # the target counts false cuts on pauses up to 1 s


def mode_report(rows: list[dict]) -> dict:
    paused = [r for r in rows if not r["complete"]]
    short = [r for r in paused if r.get("pause_ms") is not None and r["pause_ms"] <= UP_TO_MS]
    complete = [r for r in rows if r["complete"]]
    v2v = [r["voice_to_voice_ms"] for r in complete if r["voice_to_voice_ms"] is not None]
    return {"false_cuts": sum(r["false_cut"] for r in paused), "paused_items": len(paused),
            "false_cut_rate": round(sum(r["false_cut"] for r in paused) / max(1, len(paused)), 3),
            "false_cuts_up_to_1s": sum(r["false_cut"] for r in short), "paused_items_up_to_1s": len(short),
            "missed_ends": sum(r["missed_end"] for r in complete), "complete_items": len(complete),
            "missed_end_rate": round(sum(r["missed_end"] for r in complete) / max(1, len(complete)), 3),
            "late_verdicts": sum(r.get("late_verdict", False) for r in complete),
            "last_word_late": sum(r.get("last_word_late", False) for r in rows),
            "unanswered": sum(1 for r in complete if r["voice_to_voice_ms"] is None),
            "voice_to_voice_ms": summary(v2v)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="voxlane bench turns", description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", default="dev", choices=tuple(SETS), dest="turn_set",
                        help="the sentences: dev (the rules were chosen on it) or a held-out set (report on it)")
    parser.add_argument("--modes", default=",".join(MODES), help="end-of-turn modes to compare, alternately")
    parser.add_argument("--sentences", type=int, default=None, help="use the first N sentences (2 items each)")
    parser.add_argument("--json", action="store_true")
    add_model_arguments(parser)
    parser.set_defaults(temperature=0.0, max_tokens=24)
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        if mode not in VARIANTS:
            parser.error(f"unknown mode {mode!r} (known: {', '.join(VARIANTS)})")
    config = app_config(args)
    models = load_models(config)
    personas = pick_persona(args, config)
    base: Persona = personas if isinstance(personas, Persona) else personas.get(config.personas.default)
    models.warm_up([base.voice])
    load_before = os.getloadavg()
    try:
        items = load_turn_set(models, args.sentences, log=None if args.json else sys.stderr, name=args.turn_set)
        rows: dict[str, list[dict]] = {m: [] for m in modes}
        for index, item in enumerate(items):
            for mode in (modes if index % 2 == 0 else modes[::-1]):  # alternate who goes first
                persona = dataclasses.replace(base, endpointing=dataclasses.replace(base.endpointing, **VARIANTS[mode]))
                row = run_item(models, persona, config, item, session=f"turns-{mode}-{index}",
                               pipeline_settings=pipeline_config(config, mode))
                rows[mode].append(row)
                if not args.json:
                    print(f"  {mode:8} {item.name:28} turns={row['turns']} cut={row['false_cut']!s:5} "
                          f"missed={row['missed_end']!s:5} v2v={row['voice_to_voice_ms']} p={row['p_complete']} "
                          f"heard={row['heard']!r}", file=sys.stderr)
    finally:
        models.close()
    data = {"conditions": {"load_average_before": [round(x, 2) for x in load_before],
                           "load_average_after": [round(x, 2) for x in os.getloadavg()], "cpu_count": os.cpu_count(),
                           "set": args.turn_set, "items": len(items), "asr": config.models.asr, "llm": config.models.llm,
                           "pause_ms": config.pipeline.vad.pause_ms,
                           "endpointing": dataclasses.asdict(base.endpointing)},
            "modes": {m: mode_report(r) for m, r in rows.items()}, "rows": rows}
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print_report(data)
    return 0


def print_report(data: dict) -> None:
    c = data["conditions"]
    e = c["endpointing"]
    print(f"turn taking on {c['items']} utterances of the {c.get('set', 'dev')} set ({c['asr']}, {c['llm']}; semantic: short {e['short_silence_ms']} ms, "
          f"long {e['long_silence_ms']} ms, threshold {e['threshold']}; silence: {e['silence_ms']} ms; pause_ms "
          f"{c['pause_ms']}; load average {c['load_average_before']} -> {c['load_average_after']} on {c['cpu_count']} CPUs)")
    print(f"{'mode':10} {'false cuts':>14} {'<= 1 s':>8} {'missed ends':>14} {'(late)':>7} {'v2v p50':>9} "
          f"{'v2v p95':>9} {'word late':>9}")
    for mode, r in data["modes"].items():
        print(f"{mode:10} {r['false_cuts']:>4}/{r['paused_items']:<3} {100 * r['false_cut_rate']:>4.0f} % "
              f"{r.get('false_cuts_up_to_1s', 0):>4}/{r.get('paused_items_up_to_1s', 0):<3} "
              f"{r['missed_ends']:>4}/{r['complete_items']:<3} {100 * r['missed_end_rate']:>4.0f} % {r['late_verdicts']:>7} "
              f"{r['voice_to_voice_ms']['p50']:>9} {r['voice_to_voice_ms']['p95']:>9} {r.get('last_word_late', 0):>9}")
    print("false cut: a paused, unfinished sentence was ended in its pause (<= 1 s: among pauses up to 1 s); missed end: a finished question "
          "waited the long maximum; voice to voice: true end of speech -> first audio, complete questions; "
          "word late: items judged without the last word's timing (it missed its deadline)")
