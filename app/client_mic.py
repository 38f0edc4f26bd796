"""``voxlane client --mic``: a live conversation with a server through this computer's microphone
and speakers (the same device layer, echo gate and playback buffer as ``voxlane mic``)."""
from __future__ import annotations

import asyncio
import json
import sys
import time

from app.audio_devices import AudioDeviceError, AudioDevices, SoundDevices, require_devices
from app.echo_gate import EchoGate
from app.playback_buffer import PlaybackBuffer
from app.ws_client import start_session

BLOCK_MS = 20


async def run_mic(url: str, args, devices: AudioDevices | None = None) -> int:
    """Until Ctrl-C, ``args.turns`` answered turns, or (file microphone) the input ends and all is played."""
    import websockets

    try:
        devices = devices or SoundDevices()
        require_devices(devices.list())
    except AudioDeviceError as error:
        print(f"voxlane client: {error}", file=sys.stderr)
        return 2
    loop = asyncio.get_running_loop()
    mic_blocks: asyncio.Queue = asyncio.Queue(maxsize=500)  # 10 s; a stalled socket drops, never grows
    gate = None if args.no_echo_gate else EchoGate()
    buffer = PlaybackBuffer(22050)

    def play(num_samples: int):
        block = buffer.read(num_samples)
        if gate is not None:
            gate.played(block)
        return block

    def on_block(block, rate_hz: int) -> None:  # on the audio thread
        block = gate.process(block) if gate is not None else block
        loop.call_soon_threadsafe(_offer, mic_blocks, block)

    output = devices.open_output(args.output, 22050, BLOCK_MS, play)
    buffer.rate_hz = output.rate_hz
    source = devices.open_input(args.input, 16000, BLOCK_MS, on_block)
    turns = 0
    try:
        async with websockets.connect(url, max_size=None) as ws:
            await start_session(ws, source.rate_hz, args.persona, args.token, args.timeout)
            print(f"[connected; microphone at {source.rate_hz} Hz, speakers at {output.rate_hz} Hz; Ctrl-C to quit]",
                  file=sys.stderr, flush=True)
            sender = asyncio.create_task(_send_audio(ws, mic_blocks))
            reporter = asyncio.create_task(_report_playback(ws, buffer))
            try:
                pending = None
                heard_at = None  # when a final transcript came whose turn has not ended yet
                while True:
                    try:
                        raw = await asyncio.wait_for(ws.recv(), 0.5)
                    except asyncio.TimeoutError:
                        # A file microphone has ended: stop once all is played, but not while an
                        # answer is still coming (a busy server may take seconds to its first audio).
                        is_answering = heard_at is not None and time.monotonic() - heard_at < args.timeout
                        if _file_input_done(devices) and buffer.num_buffered == 0 and not is_answering:
                            break
                        continue
                    if isinstance(raw, bytes):
                        if pending is not None:
                            import numpy as np

                            buffer.push(pending["gen"], np.frombuffer(raw, dtype="<i2"), pending["sample_rate"])
                        pending = None
                        continue
                    message = json.loads(raw)
                    kind = message["type"]
                    if kind == "audio":
                        pending = message
                    elif kind == "interrupted":
                        buffer.flush(message["gen"])
                    elif kind == "playback":
                        buffer.is_paused = message["action"] == "pause"
                    elif kind == "transcript" and message["final"] and message["text"]:
                        heard_at = time.monotonic()
                        print(f"you> {message['text']}\nassistant> ", end="", flush=True)
                    elif kind == "assistant_delta":
                        print(message["text"], end="", flush=True)
                    elif kind == "turn":
                        heard_at = None
                        print(flush=True)
                        turns += 1
                        if args.turns and turns >= args.turns:
                            while buffer.num_buffered:
                                await asyncio.sleep(0.05)
                            break
                    elif kind == "error":
                        print(f"\nerror ({message['code']}): {message['message']}", file=sys.stderr, flush=True)
                        if message.get("fatal"):
                            return 1
            finally:
                sender.cancel()
                reporter.cancel()
            await ws.send(json.dumps({"type": "end"}))
    finally:
        source.close()
        output.close()
    return 0


def _offer(queue: asyncio.Queue, item) -> None:
    if not queue.full():
        queue.put_nowait(item)


def _file_input_done(devices) -> bool:
    done = getattr(devices, "is_input_done", None)
    return done is not None and done.is_set()


async def _send_audio(ws, blocks: asyncio.Queue) -> None:
    while True:
        block = await blocks.get()
        await ws.send(block.astype("<i2").tobytes())


async def _report_playback(ws, buffer: PlaybackBuffer) -> None:
    """What has been heard, ~5 times a second, so an interrupted reply is remembered as heard."""
    sent: dict[int, int] = {}
    while True:
        await asyncio.sleep(0.2)
        for gen, heard in list(buffer.heard.items()):
            if sent.get(gen) != int(heard):
                sent[gen] = int(heard)
                await ws.send(json.dumps({"type": "played", "gen": gen, "samples": int(heard)}))
