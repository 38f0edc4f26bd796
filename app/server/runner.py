"""Runs the ASGI app with uvicorn on a background thread: for tests, benchmarks and embedding
Voxlane in another program (``voxlane serve`` runs uvicorn in the foreground instead)."""
from __future__ import annotations

import socket
import threading
import time

import uvicorn


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class BackgroundServer:
    """``with BackgroundServer(app) as server: ... server.ws_url ...``"""

    def __init__(self, app, host: str = "127.0.0.1", port: int | None = None, max_message_bytes: int = 1 << 20):
        self.host = host
        self.port = port or free_port(host)
        config = uvicorn.Config(app, host=host, port=self.port, log_level="warning", lifespan="off",
                                ws_max_size=4 * max_message_bytes, ws_per_message_deflate=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="voxlane-uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.port}/ws"

    def start(self, timeout_s: float = 60.0) -> "BackgroundServer":
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {self.url}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
