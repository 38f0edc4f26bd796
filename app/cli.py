"""The ``voxlane`` command: one subcommand per module in app/commands (a few parse their own arguments)."""
from __future__ import annotations

import argparse
import importlib
import os
import sys

# Commands whose argument parsing belongs to the room that implements them: ``voxlane NAME ARGS``
# calls ``module.main(ARGS)``.
DELEGATED = {
    "converse": ("app.commands.converse", "run the whole voice pipeline on WAV files, no devices"),
    "client": ("app.commands.client", "talk to a running server over the WebSocket protocol (--wav or --mic)"),
    "mic": ("app.commands.mic", "talk to Voxlane with this computer's microphone and speakers"),
}
BENCHMARKS = {
    "answers": ("bench.answers", "answer quality on everyday questions, per model, scored by rules"),
    "engine": ("bench.engine", "our LLM engine against transformers (and llama.cpp if importable)"),
    "latency": ("bench.latency", "voice-to-voice latency per stage on spoken questions"),
    "turns": ("bench.turns", "turn taking per end-of-turn mode: false cuts, missed ends, voice to voice"),
    "load": ("bench.load", "concurrent WebSocket clients against a server"),
    "startup": ("bench.startup", "cold start: voxlane serve to /healthz ready, per phase, and its memory"),
}
COMMANDS = ["chat", "say", "models", "personas", "doctor", "serve"]  # modules in app/commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="voxlane",
        description="Voxlane: a local-first, real-time voice assistant with its own LLM engine.",
    )
    parser.add_argument("--config", help="path to voxlane.toml (default: $VOXLANE_CONFIG, ./voxlane.toml, "
                                         "~/.config/voxlane/voxlane.toml, else built-in defaults)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"app.commands.{name}").add_parser(sub)
    for name, (_, help_text) in DELEGATED.items():
        sub.add_parser(name, help=help_text, add_help=False)
    bench = sub.add_parser("bench", help="benchmarks that print figures (--json for machines)")
    bench.add_argument("which", choices=sorted(BENCHMARKS),
                       help="; ".join(f"{k}: {v[1]}" for k, v in sorted(BENCHMARKS.items())))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    # Delegated commands parse their own arguments; a leading --config reaches them via the environment.
    head = argv[2:] if argv[:1] == ["--config"] and len(argv) > 1 else argv
    if head and head[0] in DELEGATED or head[:1] == ["bench"] and head[1:2] and head[1] in BENCHMARKS:
        if head is not argv:
            os.environ["VOXLANE_CONFIG"] = argv[1]
        if head[0] == "bench":
            return _call(BENCHMARKS[head[1]][0], head[2:])
        return _call(DELEGATED[head[0]][0], head[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return importlib.import_module(f"app.commands.{args.command}").run(args)


def _call(module: str, argv: list[str]) -> int:
    try:
        entry = importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name == module:
            print(f"voxlane: '{module}' is not available in this version", file=sys.stderr)
            return 2
        raise
    return int(entry.main(argv) or 0)
