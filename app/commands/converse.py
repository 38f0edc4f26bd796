"""``voxlane converse``: the whole voice pipeline on WAV files, with no audio devices.

    voxlane converse question1.wav question2.wav -o answers.wav [--barge-in-at 1.0] [--json]

Each file is one user turn, fed in real time (then silence while the assistant answers); the
assistant's audio is played on a virtual speaker and written, as heard, to ``-o``. Prints each
turn's transcript, answer and latency waterfall.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from app.scripted_user import InputAudio, ScriptedRun, ScriptedUser
from pipeline.config import PipelineConfig
from pipeline.frames import AudioOut
from pipeline.models import PipelineModels
from pipeline.persona.persona import Persona
from pipeline.persona.store import PersonaStore
from pipeline.pipeline import Pipeline
from pipeline.wavfile import read_wav, write_wav


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags that override the app config (voxlane.toml: ``--config`` before the command, or $VOXLANE_CONFIG)."""
    parser.add_argument("--asr", help="ASR model: packaged name, path or hub name (default: [models] asr)")
    parser.add_argument("--llm", help="LLM model: packaged name, path or hub name (default: [models] llm)")
    parser.add_argument("--llm-backend", choices=("engine", "transformers", "openai"),
                        help="engine: our own (KV cache kept per session); transformers: the reference; "
                             "openai: a remote server (default: [llm] backend)")
    parser.add_argument("--persona", help="persona name, a file stem (default: [personas] default)")
    parser.add_argument("--persona-dir", type=Path, action="append", help="extra persona directory")
    parser.add_argument("--temperature", type=float, help="override the persona's temperature (0 = greedy)")
    parser.add_argument("--max-tokens", type=int, help="override the persona's max_tokens")
    parser.add_argument("--seed", type=int, help="sampling seed")
    parser.add_argument("--endpointing", choices=("semantic", "silence"),
                        help="override the persona's end-of-turn mode (semantic: the voice and the words decide; "
                             "silence: its fixed silence_ms)")
    parser.add_argument("--no-partials", action="store_true", help="no partial transcripts while speaking")
    parser.add_argument("--pause-ms", type=int,
                        help="silence after which the end-of-turn signals are read (default: [pipeline.vad] pause_ms)")
    parser.add_argument("--answer-pause-ms", type=int,
                        help="silence after which the answer starts speculatively, held until the turn ends "
                             "(default: [pipeline.vad] answer_pause_ms; at most pause_ms)")


def app_config(args: argparse.Namespace):
    """The app config (voxlane.toml and VOXLANE_* variables) with the command line's overrides."""
    from app.config import load_config

    config = load_config()
    models = dataclasses.replace(config.models, **{k: v for k, v in (("asr", args.asr), ("llm", args.llm)) if v})
    llm = dataclasses.replace(config.llm, backend=args.llm_backend or config.llm.backend)
    pipeline = config.pipeline
    if args.no_partials:
        pipeline = dataclasses.replace(pipeline, asr=dataclasses.replace(pipeline.asr, is_partial_enabled=False))
    pauses = {k: v for k, v in (("pause_ms", args.pause_ms), ("answer_pause_ms", args.answer_pause_ms)) if v is not None}
    if pauses:
        pipeline = dataclasses.replace(pipeline, vad=dataclasses.replace(pipeline.vad, **pauses))
    personas = dataclasses.replace(config.personas, default=args.persona or config.personas.default)
    return dataclasses.replace(config, models=models, llm=llm, pipeline=pipeline, personas=personas)


def load_models(config) -> PipelineModels:
    """Every model, resolved (packaged, local or hub) and loaded once."""
    from app.voice_models import load_voice_models

    return load_voice_models(config)


def pick_persona(args: argparse.Namespace, config) -> Persona | PersonaStore:
    """The store (hot reload) unless the command line overrides sampling or endpointing, then a fixed copy."""
    from pipeline.persona.store import SHIPPED_DIR

    store = PersonaStore([SHIPPED_DIR, config.personas.user_dir] + list(args.persona_dir or []))
    mode = getattr(args, "endpointing", None)
    if args.temperature is None and args.max_tokens is None and args.seed is None and mode is None:
        return store
    persona = store.get(config.personas.default)
    changes = {k: v for k, v in (("temperature", args.temperature), ("max_tokens", args.max_tokens),
                                 ("seed", args.seed)) if v is not None}
    endpointing = dataclasses.replace(persona.endpointing, mode=mode or persona.endpointing.mode)
    return dataclasses.replace(persona, sampling=dataclasses.replace(persona.sampling, **changes),
                               endpointing=endpointing)


def make_pipeline(models: PipelineModels, personas, persona: str, config: PipelineConfig,
                  session: str = "converse") -> Pipeline:
    return Pipeline(llm=models.llm, tts=models.tts, personas=personas, persona=persona,
                    transcriber=models.transcriber, vad_model=models.vad_model, config=config,
                    session=session, turn_model=models.turn_model)


def read_input(path: Path) -> InputAudio:
    samples, rate, channels = read_wav(path)
    return InputAudio(samples, rate, channels)


def report(result: ScriptedRun, history=()) -> dict:
    written = {e.gen: e.assistant for e in history}  # an interrupted turn has no AssistantDone frame
    turns = []
    for turn in result.turns:
        turns.append({"gen": turn.gen, "user": turn.user, "partials": turn.partials,
                      "assistant": turn.assistant or written.get(turn.gen, ""),
                      "spoken": turn.spoken, "error": turn.error, "voice_to_voice_ms": turn.voice_to_voice_ms,
                      "waterfall": turn.waterfall})
    return {"turns": turns, "barge_in_stop_ms": result.barge_in_stop_ms, "barge_in_detect_ms": result.barge_in_detect_ms}


def played_audio(result: ScriptedRun, gap_s: float = 0.25) -> tuple[np.ndarray, int, list[dict]]:
    """Everything the virtual speaker played, turn after turn, at the first turn's rate, and where
    each speakable chunk is in it: ``{"gen", "index", "text", "start_s", "end_s"}`` (a chunk cut
    short by an interruption ends where playback stopped)."""
    from pipeline.audio import resample_once

    rates = [r for r in result.player.sample_rate.values()]
    rate = rates[0] if rates else 22050
    pieces, chunks, offset_s = [], [], 0.0
    for turn in result.turns:
        audio = result.player.audio(turn.gen)
        if len(audio):
            turn_rate = result.player.sample_rate[turn.gen]
            spans: dict[int, dict] = {}
            for frame in result.frames:
                if isinstance(frame, AudioOut) and frame.gen == turn.gen and frame.start_sample < len(audio):
                    end = min(len(audio), frame.start_sample + len(frame.pcm))
                    span = spans.setdefault(frame.chunk_index, {"gen": turn.gen, "index": frame.chunk_index,
                                                                "text": frame.text, "start": frame.start_sample})
                    span["end"] = end
            for span in spans.values():
                start, end = span.pop("start"), span.pop("end")
                chunks.append({**span, "start_s": round(offset_s + start / turn_rate, 3),
                               "end_s": round(offset_s + end / turn_rate, 3)})
            pieces += [resample_once(audio, turn_rate, rate), np.zeros(int(gap_s * rate), np.int16)]
            offset_s += len(audio) / turn_rate + int(gap_s * rate) / rate
    return (np.concatenate(pieces) if pieces else np.zeros(0, np.int16)), rate, chunks


def print_text(data: dict, history) -> None:
    for turn in data["turns"]:
        print(f"--- turn {turn['gen']}")
        print(f"user:      {turn['user']}")
        print(f"assistant: {turn['assistant']}")
        if turn["error"]:
            print(f"error:     {turn['error']}")
        ms = turn["waterfall"].get("ms", {})
        print("waterfall: " + "  ".join(f"{k}={v:.0f}" for k, v in ms.items()) + " (ms from " +
              str(turn["waterfall"].get("origin")) + ")")
        if turn["voice_to_voice_ms"] is not None:
            print(f"voice-to-voice: {turn['voice_to_voice_ms']:.0f} ms (true end of speech -> first audio out)")
    if data["barge_in_stop_ms"]:
        print("barge-in: playback stopped " + ", ".join(f"{v:.0f}" for v in data["barge_in_stop_ms"]) +
              " ms of audio after the interrupting speech began")
    print("--- history")
    for exchange in history:
        mark = " [interrupted]" if exchange.is_interrupted else ""
        print(f"user: {exchange.user}\nassistant{mark}: {exchange.reply}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="voxlane converse", description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", type=Path, help="WAV files, one user turn each (any rate/channels)")
    parser.add_argument("-o", "--output", type=Path, help="write the assistant's audio, as played, to this WAV")
    parser.add_argument("--barge-in-at", type=float, metavar="S",
                        help="start each next file S seconds after the previous answer began playing")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    add_model_arguments(parser)
    args = parser.parse_args(argv)
    for path in args.inputs:
        if not path.is_file():
            print(f"voxlane converse: no such file: {path}", file=sys.stderr)
            return 2
    config = app_config(args)
    inputs = [read_input(p) for p in args.inputs]
    models = load_models(config)
    personas = pick_persona(args, config)
    pipeline = make_pipeline(models, personas, config.personas.default, config.pipeline)
    models.warm_up([pipeline.current_persona().voice])
    try:
        result = ScriptedUser(pipeline).run(inputs, args.barge_in_at)
        history = pipeline.history
    finally:
        pipeline.close()
        models.close()
    data = report(result, history)
    data["history"] = [{"user": e.user, "assistant": e.reply, "interrupted": e.is_interrupted} for e in history]
    if args.output:
        audio, rate, chunks = played_audio(result)
        write_wav(args.output, audio, rate)
        data["output"] = {"path": str(args.output), "sample_rate": rate, "seconds": round(len(audio) / rate, 2),
                          "chunks": chunks}
    if args.json:
        print(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        print_text(data, history)
        if args.output:
            print(f"wrote {args.output} ({data['output']['seconds']} s at {data['output']['sample_rate']} Hz)")
    return 0 if all(not t["error"] for t in data["turns"]) else 1
