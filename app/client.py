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
import time
from dataclasses import dataclass, field

import numpy as np

FRAME_MS = 20


@dataclass
class TurnResult:
    """What one turn looked like from the client's side."""

    transcript: str = ""
    reply: str = ""
    gen: int = 0
    audio: list[np.ndarray] = field(default_factory=list)
    sample_rate: int = 0
    waterfall: dict = field(default_factory=dict)
    first_audio_ms: float | None = None  # end of the question's audio (or text sent) -> first reply audio received
    errors: list[dict] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)

    def pcm(self) -> np.ndarray:
        return np.concatenate(self.audio) if self.audio else np.zeros(0, np.int16)


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


async def recv_json(ws, timeout: float) -> dict:
    """The next text message (binary messages are only ever expected right after an audio header)."""
    raw = await asyncio.wait_for(ws.recv(), timeout)
    if isinstance(raw, bytes):
        raise RuntimeError("unexpected binary message")
    return json.loads(raw)


async def start_session(ws, sample_rate: int, persona: str | None, token: str, timeout: float) -> dict:
    start = {"type": "start", "version": 1, "sample_rate": sample_rate, "format": "pcm16", "token": token}
    if persona:
        start["persona"] = persona
    await ws.send(json.dumps(start))
    ready = await recv_json(ws, timeout)
    if ready.get("type") != "ready":
        raise RuntimeError(f"server refused the session: {ready}")
    return ready


async def stream_wav(ws, pcm: np.ndarray, rate: int, is_realtime: bool, marks: dict, tail_s: float = 2.0) -> None:
    """Sends the question in 20 ms frames, then ``tail_s`` of silence so the server's VAD hears
    the end of the turn (as it would from a live microphone): at least the persona's
    ``long_silence_ms`` (1.6 s), which a question that sounds unfinished waits for. ``marks["speech_sent"]`` is when
    the question's last sample went out: the client's "the user stopped talking"."""
    frame = rate * FRAME_MS // 1000
    audio = np.concatenate([pcm, np.zeros(int(tail_s * rate), np.int16)])
    start = time.monotonic()
    for i, pos in enumerate(range(0, len(audio), frame)):
        await ws.send(audio[pos:pos + frame].astype("<i2").tobytes())
        if pos < len(pcm) <= pos + frame:
            marks["speech_sent"] = time.monotonic()
        if is_realtime:
            await asyncio.sleep(max(0.0, start + (i + 1) * FRAME_MS / 1000 - time.monotonic()))
        else:
            await asyncio.sleep(0)


async def collect_turn(ws, timeout: float, on_message=None, marks: dict | None = None) -> TurnResult:
    """Reads server messages until the first turn with a reply is done ("turn" message).
    ``marks["speech_sent"]`` (set by the sender) is where first_audio_ms counts from."""
    result = TurnResult()
    marks = {} if marks is None else marks
    deadline = time.monotonic() + timeout
    while True:
        message = await recv_json(ws, max(0.1, deadline - time.monotonic()))
        result.messages.append(message)
        if on_message:
            on_message(message)
        kind = message["type"]
        if kind == "transcript" and message["final"] and message["text"]:
            result.transcript, result.gen = message["text"], message["gen"]
        elif kind == "assistant_delta":
            result.gen = message["gen"]
            result.reply += message["text"]
        elif kind == "audio":
            pcm = np.frombuffer(await asyncio.wait_for(ws.recv(), timeout), dtype="<i2")
            if result.first_audio_ms is None and "speech_sent" in marks:
                result.first_audio_ms = 1000 * (time.monotonic() - marks["speech_sent"])
            result.audio.append(pcm)
            result.sample_rate = message["sample_rate"]
        elif kind == "error":
            result.errors.append(message)
            if message.get("fatal"):
                return result
        elif kind == "turn" and (result.reply or result.audio) and message["gen"] == result.gen:
            result.waterfall = message["waterfall"]
            return result


async def one_turn(url: str, *, wav: str | None = None, text: str | None = None, persona: str | None = None,
                   token: str = "", is_realtime: bool = True, timeout: float = 120.0, on_message=None) -> TurnResult:
    """Connect, ask one question (spoken from a WAV, or typed), return the answer, disconnect."""
    import websockets

    from pipeline.audio import to_mono_float32
    from pipeline.wavfile import read_wav

    if wav:
        data, rate, channels = read_wav(wav)
        pcm = np.clip(to_mono_float32(data, channels) * 32768, -32768, 32767).astype(np.int16)
    else:
        pcm, rate = np.zeros(0, np.int16), 16000
    async with websockets.connect(url, max_size=None) as ws:
        await start_session(ws, rate, persona, token, timeout)
        marks: dict = {}
        if wav:
            sender = asyncio.create_task(stream_wav(ws, pcm, rate, is_realtime, marks))
            result = await collect_turn(ws, timeout, on_message, marks)
            sender.cancel()
        else:
            await ws.send(json.dumps({"type": "text", "text": text}))
            marks["speech_sent"] = time.monotonic()
            result = await collect_turn(ws, timeout, on_message, marks)
        await ws.send(json.dumps({"type": "end"}))
    return result


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
