"""``voxlane bench load``: many simulated clients talking to one server at once, over loopback.

Each client opens one session and asks its own spoken question (a WAV) several turns in a row;
the benchmark checks every turn was answered, and answered for the right client (its transcript
carries that client's keyword: no cross-talk), and prints turns/s, voice-to-voice latency under
load (p50/p95, from the server's waterfall: end of speech -> first reply audio sent) and the
server's peak resident memory (sampled from /metrics).

    voxlane bench load                       # start a server here (default config), 8 clients x 5 turns
    voxlane bench load --url ws://127.0.0.1:7860/ws --clients 4 --turns 3
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# The first eight are words Whisper (tiny.en as well as base) hears right in espeak-ng's voice;
# tiny.en mishears "apple", "piano", "silver" and "planet" there, so they come last.
KEYWORDS = ("river", "guitar", "mountain", "pencil", "tiger", "window", "orange", "castle",
            "rocket", "garden", "dragon", "coffee", "apple", "piano", "silver", "planet")


@dataclass
class LoadReport:
    num_clients: int
    num_turns: int
    wall_s: float = 0.0
    turns: list[dict] = field(default_factory=list)  # client, turn, transcript, reply, v2v_ms, errors
    failures: list[str] = field(default_factory=list)
    rss_before: float = 0.0
    rss_peak: float = 0.0
    rss_after: float = 0.0

    @property
    def turns_per_s(self) -> float:
        return len(self.turns) / self.wall_s if self.wall_s else 0.0

    def v2v_ms(self, q: float, is_spoken: bool = True) -> float:
        values = [t["v2v_ms"] for t in self.turns if t["v2v_ms"] is not None and t["is_spoken"] == is_spoken]
        return float(np.percentile(values, q)) if values else float("nan")

    def summary(self) -> str:
        mib = 1 / (1 << 20)
        latency = []
        if any(t["is_spoken"] for t in self.turns):
            latency.append(f"voice-to-voice under load p50 {self.v2v_ms(50):.0f} ms, p95 {self.v2v_ms(95):.0f} ms "
                           "(spoken turns)")
        if not all(t["is_spoken"] for t in self.turns):
            latency.append(f"text-to-voice p50 {self.v2v_ms(50, False):.0f} ms, p95 {self.v2v_ms(95, False):.0f} ms "
                           "(typed turns)")
        return (f"{len(self.turns)}/{self.num_clients * self.num_turns} turns ({self.num_clients} clients x "
                f"{self.num_turns}) in {self.wall_s:.1f} s: {self.turns_per_s:.2f} turns/s; {'; '.join(latency)}; "
                f"server RSS before {self.rss_before * mib:.0f} MiB, peak {self.rss_peak * mib:.0f} MiB, after "
                f"{self.rss_after * mib:.0f} MiB; failures: {len(self.failures)}")


def speak_questions(directory: Path, num: int) -> list[tuple[str, Path]]:
    """(keyword, WAV) per client, spoken by espeak-ng: "Please tell me about the word apple."."""
    if not shutil.which("espeak-ng"):
        raise RuntimeError("espeak-ng is needed to speak the questions (apt-get install espeak-ng), or pass --wav")
    questions = []
    for keyword in (KEYWORDS * (num // len(KEYWORDS) + 1))[:num]:
        path = directory / f"{keyword}.wav"
        if not path.exists():
            subprocess.run(["espeak-ng", "-s", "160", "-w", str(path), f"Tell me one fact about {keyword}."],
                           check=True)
        questions.append((keyword, path))
    return questions


def server_rss(http_url: str, token: str = "") -> float:
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = httpx.get(http_url + "/metrics", headers=headers, timeout=10).text
    match = re.search(r"^process_resident_memory_bytes ([0-9.e+]+)$", body, re.M)
    return float(match.group(1)) if match else 0.0


async def _client(url: str, index: int, keyword: str, wav: Path, num_turns: int, is_realtime: bool,
                  timeout_s: float, persona: str | None, token: str, report: LoadReport, num_spoken: int) -> None:
    import websockets

    from app.ws_client import collect_turn, start_session, stream_wav
    from pipeline.audio import to_mono_float32
    from pipeline.wavfile import read_wav

    data, rate, channels = read_wav(str(wav))
    pcm = np.clip(to_mono_float32(data, channels) * 32768, -32768, 32767).astype(np.int16)
    try:
        async with websockets.connect(url, max_size=None) as ws:
            await start_session(ws, rate, persona, token, timeout_s)
            for turn in range(num_turns):
                marks: dict = {}
                if turn < num_spoken:
                    sender = asyncio.create_task(stream_wav(ws, pcm, rate, is_realtime, marks))
                    result = await collect_turn(ws, timeout_s, None, marks)
                    await sender
                else:  # a typed turn: the same question as text
                    await ws.send(json.dumps({"type": "text", "text": f"Tell me one fact about {keyword}."}))
                    result = await collect_turn(ws, timeout_s, None, marks)
                ms = result.waterfall.get("ms", {})
                origin = "speech_end" if turn < num_spoken else "text_in"
                v2v = ms["first_audio_out"] - ms[origin] if {"first_audio_out", origin} <= ms.keys() else None
                report.turns.append({"client": index, "turn": turn, "gen": result.gen, "is_spoken": turn < num_spoken,
                                     "transcript": result.transcript, "reply": result.reply, "v2v_ms": v2v,
                                     "errors": result.errors, "audio_samples": int(sum(len(a) for a in result.audio))})
                if result.errors:
                    report.failures.append(f"client {index} turn {turn}: errors {result.errors}")
                elif keyword not in result.transcript.lower():
                    report.failures.append(f"client {index} turn {turn}: transcript {result.transcript!r} "
                                           f"is not its question about {keyword!r}")
                elif not result.reply.strip() or not result.audio:
                    report.failures.append(f"client {index} turn {turn}: no reply or no audio")
                elif stray := [m for m in result.messages if m["type"] in ("assistant_delta", "audio")
                               and m["gen"] != result.gen]:
                    report.failures.append(f"client {index} turn {turn}: reply pieces of another turn: {stray[:2]}")
            await ws.send('{"type": "end"}')
    except Exception as error:  # reported, not raised: the other clients go on
        report.failures.append(f"client {index}: {type(error).__name__}: {error}")


async def run_load(url: str, questions: list[tuple[str, Path]], num_turns: int, *, is_realtime: bool = True,
                   timeout_s: float = 180.0, persona: str | None = None, token: str = "",
                   num_spoken: int | None = None) -> LoadReport:
    """All clients at once (one per question); returns the report. ``url`` is the server's /ws.
    The first ``num_spoken`` turns of each client are spoken (all by default), the rest typed."""
    num_spoken = num_turns if num_spoken is None else num_spoken
    http_url = url.replace("ws://", "http://").replace("wss://", "https://").rsplit("/ws", 1)[0]
    report = LoadReport(len(questions), num_turns)
    report.rss_before = report.rss_peak = await asyncio.to_thread(server_rss, http_url, token)
    done = asyncio.Event()

    async def sample_memory() -> None:
        while not done.is_set():
            report.rss_peak = max(report.rss_peak, await asyncio.to_thread(server_rss, http_url, token))
            await asyncio.sleep(0.5)

    sampler = asyncio.create_task(sample_memory())
    started = time.monotonic()
    await asyncio.gather(*(_client(url, i, keyword, wav, num_turns, is_realtime, timeout_s, persona, token, report,
                                   num_spoken)
                           for i, (keyword, wav) in enumerate(questions)))
    report.wall_s = time.monotonic() - started
    done.set()
    await sampler
    report.rss_after = await asyncio.to_thread(server_rss, http_url, token)
    report.rss_peak = max(report.rss_peak, report.rss_after)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="voxlane bench load", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="a running server's WebSocket URL (default: start one here with the config)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--turns", type=int, default=5, help="turns per client, in one session")
    p.add_argument("--spoken", type=int, help="how many of each client's turns are spoken WAVs (default: all); "
                                              "the rest are typed")
    p.add_argument("--fast", action="store_true", help="send audio as fast as possible instead of in real time")
    p.add_argument("--persona", help="persona for every client (default: the server's)")
    p.add_argument("--token", default="", help="access token, if the server requires one")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for each answer")
    p.add_argument("--config", help="config file for the server started here")
    args = p.parse_args(argv)
    if not 1 <= args.clients <= 64 or not 1 <= args.turns <= 100:
        p.error("--clients must be in [1, 64] and --turns in [1, 100]")
    with tempfile.TemporaryDirectory(prefix="voxlane-load-") as tmp:
        questions = speak_questions(Path(tmp), args.clients)
        if args.url:
            report = asyncio.run(run_load(args.url, questions, args.turns, is_realtime=not args.fast,
                                          timeout_s=args.timeout, persona=args.persona, token=args.token,
                                          num_spoken=args.spoken))
        else:
            report = _with_local_server(args, questions)
    for failure in report.failures:
        print(f"FAILED {failure}", file=sys.stderr)
    print(report.summary())
    return 1 if report.failures else 0


def _with_local_server(args, questions) -> LoadReport:
    """A server on a free loopback port in this process, models warmed up, as ``voxlane serve`` does."""
    import dataclasses
    import os

    from app.malloc_arenas import limit_malloc_arenas

    limit_malloc_arenas()  # as voxlane serve does
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from app.config import load_config
    from app.server.app import create_app
    from app.pipeline_sessions import PipelineSessions
    from app.server.runner import BackgroundServer

    config = load_config(args.config)
    config = dataclasses.replace(config, server=dataclasses.replace(
        config.server, host="127.0.0.1", max_sessions=max(config.server.max_sessions, args.clients),
        max_connections=max(config.server.max_connections, 2 * args.clients),
        max_pending_sockets=max(config.server.max_pending_sockets, args.clients),
        max_pending_per_client=max(config.server.max_pending_per_client, args.clients)))
    print(f"loading models (LLM backend {config.llm.backend}) …", file=sys.stderr, flush=True)
    factory = PipelineSessions(config, warm=True)  # loaded and warmed in parallel, as voxlane serve does
    try:
        with BackgroundServer(create_app(config, factory, with_ui=False),
                              max_message_bytes=config.server.max_message_bytes) as server:
            return asyncio.run(run_load(server.ws_url, questions, args.turns, is_realtime=not args.fast,
                                        timeout_s=args.timeout, persona=args.persona, token=config.server.access_token,
                                        num_spoken=args.spoken))
    finally:
        factory.close()
