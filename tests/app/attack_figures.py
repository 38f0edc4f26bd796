"""Figures of the flood and load attacks of issue 11, against a running ``voxlane serve``:

    python -m tests.app.attack_figures --url http://127.0.0.1:7860 [--token T] [--json]

- /healthz latency (median of 20) alone, then while sockets that never send ``start`` flood the
  server with 1 MiB text frames of nested empty lists;
- another session's typed turn (text in -> its ``turn`` message) alone and during that flood;
- the server's RSS (from /metrics) around a 20 MiB body sent without the token and a
  schema-valid 24 MiB ``/v1/chat/completions`` request.

A measurement, not a test: it prints figures (state the load average with them). It lives under
tests/ because no runtime room may import it.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

import httpx
import websockets

FLOOD_FRAME = "[" + ",".join(["[]"] * ((1 << 20) // 3 - 2)) + "]"  # ~1 MiB of nested empty lists


async def healthz_median_ms(client: httpx.AsyncClient, n: int = 20) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        await client.get("/healthz")
        times.append((time.perf_counter() - t0) * 1000)
        await asyncio.sleep(0.05)
    return statistics.median(times)


async def text_turn_s(ws_url: str, token: str, text: str = "Say hello.") -> float:
    async with websockets.connect(ws_url, max_size=None, open_timeout=60) as ws:
        await ws.send(json.dumps({"type": "start", "version": 1, "sample_rate": 16000, "token": token}))
        while json.loads(await asyncio.wait_for(ws.recv(), 120))["type"] != "ready":
            pass
        t0 = time.perf_counter()
        await ws.send(json.dumps({"type": "text", "text": text}))
        while True:
            message = await asyncio.wait_for(ws.recv(), 300)
            if isinstance(message, str) and json.loads(message)["type"] == "turn":
                return time.perf_counter() - t0


async def flood(ws_url: str, stop: asyncio.Event, counter: list[int]) -> None:
    """One attacker: a socket that never starts, sending 1 MiB text frames; reconnects when closed."""
    while not stop.is_set():
        try:
            async with websockets.connect(ws_url, max_size=None, open_timeout=30) as ws:
                while not stop.is_set():
                    await ws.send(FLOOD_FRAME)
                    counter[0] += 1
        except Exception:
            await asyncio.sleep(0.05)


async def rss_mib(client: httpx.AsyncClient, token: str) -> float:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    text = (await client.get("/metrics", headers=headers)).text
    line = next(x for x in text.splitlines() if x.startswith("process_resident_memory_bytes"))
    return float(line.split()[-1]) / (1 << 20)


async def big_request(client: httpx.AsyncClient, path: str, body: bytes, headers: dict) -> str:
    """The status, or the error that ended the request (a server may close while the body is sent)."""
    try:
        response = await client.post(path, content=body, headers={"content-type": "application/json", **headers},
                                     timeout=600)
        return str(response.status_code)
    except httpx.HTTPError as error:
        return type(error).__name__


class Figures(dict):
    """Printed as they come (a long run that fails late still shows what it measured)."""

    def __init__(self, quiet: bool):
        super().__init__()
        self.quiet = quiet

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        if not self.quiet:
            print(f"{key:28} {value}", flush=True)


async def main(url: str, token: str, attackers: int, flood_s: float, quiet: bool = False,
               parts: tuple[str, ...] = ("flood", "bodies")) -> dict:
    ws_url = url.replace("http", "ws", 1) + "/ws"
    out = Figures(quiet)
    out["load_average"] = os.getloadavg()
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        if "flood" in parts:
            await flood_figures(client, ws_url, token, attackers, flood_s, out)
        if "bodies" in parts:
            await body_figures(client, token, out)
    out["load_average_after"] = os.getloadavg()
    return out


async def flood_figures(client, ws_url: str, token: str, attackers: int, flood_s: float, out: dict) -> None:
    out["healthz_ms_alone"] = await healthz_median_ms(client)
    out["turn_s_alone"] = await text_turn_s(ws_url, token)
    stop, sent = asyncio.Event(), [0]
    tasks = [asyncio.create_task(flood(ws_url, stop, sent)) for _ in range(attackers)]
    await asyncio.sleep(2.0)  # the flood is under way
    t_end = time.monotonic() + flood_s
    out["healthz_ms_flood"] = await healthz_median_ms(client)
    out["turn_s_flood"] = await text_turn_s(ws_url, token)
    while time.monotonic() < t_end:
        await asyncio.sleep(0.2)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    out["flood_frames_sent"] = sent[0]


async def body_figures(client, token: str, out: dict) -> None:
    out["rss_mib_before_bodies"] = await rss_mib(client, token)
    body = json.dumps({"messages": [{"role": "user", "content": "x" * (20 << 20)}]}).encode()
    out["status_20mib_no_token"] = await big_request(client, "/v1/chat/completions", body, {})
    out["rss_mib_after_20mib"] = await rss_mib(client, token)
    content = "word " * ((24 << 20) // 5 // 256)
    body = json.dumps({"messages": [{"role": "user", "content": content}] * 256, "max_tokens": 1}).encode()
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    out["status_24mib_v1"] = await big_request(client, "/v1/chat/completions", body, auth)
    out["rss_mib_after_24mib"] = await rss_mib(client, token)


async def attack_until_killed(url: str, attackers: int) -> None:
    """Only the flood, until the process is killed (tests/app/test_attacks_ws.py runs it beside a
    server); prints one line once the first frame of it went out."""
    stop, sent = asyncio.Event(), [0]
    tasks = [asyncio.create_task(flood(url.replace("http", "ws", 1) + "/ws", stop, sent)) for _ in range(attackers)]
    while not sent[0]:
        await asyncio.sleep(0.01)
    print("flooding", flush=True)
    await asyncio.gather(*tasks)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:7860")
    parser.add_argument("--token", default="")
    parser.add_argument("--attackers", type=int, default=4)
    parser.add_argument("--flood-s", type=float, default=10.0)
    parser.add_argument("--only", choices=("flood", "bodies"), help="one part (default: both)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--attack-only", action="store_true", help="flood until killed, measure nothing")
    args = parser.parse_args()
    if args.attack_only:
        asyncio.run(attack_until_killed(args.url, args.attackers))
    else:
        figures = asyncio.run(main(args.url, args.token, args.attackers, args.flood_s, quiet=args.json,
                                   parts=(args.only,) if args.only else ("flood", "bodies")))
        if args.json:
            print(json.dumps(figures))
