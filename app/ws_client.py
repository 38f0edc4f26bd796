"""A WebSocket client of Voxlane's protocol (docs/protocol.md): start a session, stream a WAV in
real time, collect a turn's transcript, reply, audio and waterfall. ``voxlane client``, its
``--mic`` mode and ``voxlane bench load`` are built on it."""
from __future__ import annotations

import asyncio
import json
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
