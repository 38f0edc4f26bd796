"""``voxlane mic``: talk to Voxlane with this computer's microphone and speakers (no server).

    voxlane mic --list                  the sound devices PortAudio sees
    voxlane mic [--input 2] [--output "USB"] [--persona pirate]

Without headphones the echo gate keeps the assistant from hearing (and answering) itself; speak
clearly louder than its voice to interrupt it, or use --no-echo-gate with headphones.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

from app.audio_devices import AudioDeviceError, AudioDevices, SoundDevices, require_devices
from app.echo_gate import EchoGate


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="voxlane mic", description=__doc__.split("\n\n")[0])
    p.add_argument("--list", action="store_true", help="list sound devices and exit")
    p.add_argument("--input", help="input device: index or part of its name (default: the system's)")
    p.add_argument("--output", help="output device: index or part of its name (default: the system's)")
    p.add_argument("--persona", help="persona name (default: the config's personas.default)")
    p.add_argument("--backend", choices=("engine", "transformers", "openai"), help="LLM backend")
    p.add_argument("--no-echo-gate", action="store_true", help="headphones: do not suppress the assistant's echo")
    p.add_argument("--barge-in-ratio", type=float, default=2.0,
                   help="while it speaks, your voice must be this many times louder than its own to interrupt")
    p.add_argument("--turns", type=int, help="stop after this many answered turns")
    return p


def list_devices(devices: AudioDevices) -> int:
    infos = devices.list()
    if not infos:
        print("no sound devices found", file=sys.stderr)
        return 1
    for d in infos:
        marks = ("default input " if d.is_default_input else "") + ("default output" if d.is_default_output else "")
        print(f"{d.index:>3}  {d.name:<40} in:{d.max_input_channels} out:{d.max_output_channels} "
              f"{d.default_rate_hz} Hz  {marks.strip()}")
    return 0


def _printer(persona: str):
    def on_event(kind: str, value) -> None:
        if kind == "devices":
            print(f"[microphone at {value[0]} Hz, speakers at {value[1]} Hz — speak; Ctrl-C to quit]",
                  file=sys.stderr, flush=True)
        elif kind == "transcript":
            print(f"you> {value}", flush=True)
            print(f"{persona}> ", end="", flush=True)
        elif kind == "delta":
            print(value, end="", flush=True)
        elif kind == "reply_done":
            print(" [interrupted]" if value.is_interrupted else "", flush=True)
        elif kind == "turn":
            ms = value.get("ms", {})
            if "first_audio_out" in ms:
                print(f"  (first audio {ms['first_audio_out']:.0f} ms after you stopped)", file=sys.stderr, flush=True)
        elif kind == "error":
            print(f"\nerror: {value}", file=sys.stderr, flush=True)
    return on_event


@dataclass
class MicRun:
    """How ``voxlane mic`` ended: the exit code, and what happened (for the summary and tests)."""

    code: int
    stats: object = None  # app.local_voice.VoiceLoopStats
    gate: EchoGate | None = None


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv)).code


def run(args, devices: AudioDevices | None = None, factory=None) -> MicRun:
    """``devices`` and ``factory`` are for tests (a FileDevices double, already-loaded models)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        devices = devices or SoundDevices()
        if args.list:
            return MicRun(list_devices(devices))
        require_devices(devices.list())  # fail now, with the reason, rather than after loading models
    except AudioDeviceError as error:
        print(f"voxlane mic: {error}", file=sys.stderr)
        return MicRun(2)
    from app.commands.common import config_from
    from app.local_voice import LocalVoiceLoop

    owns_factory = factory is None
    if factory is None:
        from app.pipeline_sessions import PipelineSessions

        print("voxlane mic: loading models …", file=sys.stderr, flush=True)
        factory = PipelineSessions(config_from(argparse.Namespace(config=None)), args.backend)
    persona = args.persona or factory.default_persona()
    try:
        pipeline = factory.open(persona, "mic")
    except KeyError as error:  # the pipeline checks the persona; the message lists the available ones
        print(f"voxlane mic: {error}", file=sys.stderr)
        if owns_factory:
            factory.close()
        return MicRun(2)
    gate = None if args.no_echo_gate else EchoGate(barge_in_ratio=args.barge_in_ratio)
    loop = LocalVoiceLoop(pipeline, devices, args.input, args.output, gate, _printer(persona))
    code = 0
    try:
        loop.run(max_turns=args.turns, idle_exit_s=3.0)
    except AudioDeviceError as error:
        print(f"voxlane mic: {error}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
    finally:
        pipeline.close()
        if owns_factory:
            factory.close()
    if gate is not None:
        print(f"[echo gate: {gate.num_suppressed} blocks suppressed during playback, "
              f"{gate.num_passed_during_playback} passed as barge-in]", file=sys.stderr)
    return MicRun(code, loop.stats, gate)
