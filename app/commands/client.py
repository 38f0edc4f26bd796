"""``voxlane client``: talk to a running ``voxlane serve`` over the WebSocket protocol.

    voxlane client --wav question.wav [--out reply.wav]   one spoken turn from a file
    voxlane client --text "Hello"                          one typed turn
    voxlane client --mic                                   a live conversation (local mic and speakers)

Prints the transcript, the reply, and the turn's latency (the server's waterfall plus what this
client measured). ``--json`` prints every server message as a JSON line instead.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys

from app.ws_client import TurnResult, one_turn


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="voxlane client", description=__doc__.split("\n\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--wav", help="a spoken question (any rate, mono or stereo 16-bit WAV)")
    source.add_argument("--text", help="a typed question")
    source.add_argument("--mic", action="store_true", help="live: this computer's microphone and speakers")
    p.add_argument("--url", default=None, help="server WebSocket URL (default: ws://HOST:PORT/ws from the config)")
    p.add_argument("--persona", help="persona name (default: the server's default)")
    p.add_argument("--token", default="", help="access token, if the server requires one")
    p.add_argument("--out", help="write the assistant's reply audio to this WAV")
    p.add_argument("--fast", action="store_true", help="send the WAV as fast as possible instead of in real time")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the answer")
    p.add_argument("--json", action="store_true", help="print every server message as a JSON line")
    p.add_argument("--input", help="--mic: input device (index or name part)")
    p.add_argument("--output", help="--mic: output device (index or name part)")
    p.add_argument("--no-echo-gate", action="store_true", help="--mic: headphones; do not suppress echo")
    p.add_argument("--turns", type=int, help="--mic: stop after this many answered turns")
    return p


def default_url() -> str:
    from app.config import load_config

    server = load_config().server
    return f"ws://{server.host}:{server.port}/ws"


def print_turn(result: TurnResult, persona: str) -> None:
    for error in result.errors:
        print(f"error ({error['code']}): {error['message']}", file=sys.stderr)
    if result.transcript:
        print(f"you> {result.transcript}")
    print(f"{persona}> {result.reply.strip()}", flush=True)
    ms = result.waterfall.get("ms", {})
    parts = [f"{k} {v:.0f}" for k, v in ms.items() if isinstance(v, (int, float))]
    if parts:
        print(f"waterfall (ms from {result.waterfall.get('origin')}): " + ", ".join(parts), file=sys.stderr)
    if result.first_audio_ms is not None:
        print(f"first reply audio at this client: {result.first_audio_ms:.0f} ms after the question ended",
              file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    url = args.url or default_url()
    try:
        if args.mic:
            from app.client_mic import run_mic

            try:
                return asyncio.run(run_mic(url, args))
            except KeyboardInterrupt:
                return 0
        on_message = (lambda m: print(json.dumps(m), flush=True)) if args.json else None
        result = asyncio.run(one_turn(url, wav=args.wav, text=args.text, persona=args.persona, token=args.token,
                                      is_realtime=not args.fast, timeout=args.timeout, on_message=on_message))
    except (OSError, asyncio.TimeoutError) as error:
        print(f"voxlane client: cannot talk to {url}: {error or 'timed out'}", file=sys.stderr)
        return 1
    except Exception as error:  # websockets' ConnectionClosed, a refused session: say so, no traceback
        if not isinstance(error, RuntimeError) and type(error).__module__.split(".")[0] != "websockets":
            raise
        print(f"voxlane client: {error}", file=sys.stderr)
        return 1
    if args.out and result.audio:
        from pipeline.wavfile import write_wav

        write_wav(args.out, result.pcm(), result.sample_rate)
    if not args.json:
        print_turn(result, args.persona or "assistant")
    return 1 if any(e.get("fatal") for e in result.errors) or not result.reply else 0
