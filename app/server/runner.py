"""Runs the ASGI app with uvicorn on a background thread: for tests, benchmarks and embedding
Voxlane in another program (``voxlane serve`` runs uvicorn in the foreground instead)."""
from __future__ import annotations

import dataclasses
import socket
import threading
import time

import uvicorn

from app.config import ServerConfig
from app.server.connections import uvicorn_config


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: a free port the kernel picks; read it back with
    ``getsockname()``), not yet listening: connections to it are refused until a server listens on
    it. Binding here, not probing for a free port and binding later, leaves no window in which
    another program can take the port."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    if port:  # a fixed port may be rebound at once after a restart; a picked one needs no sharing
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class BackgroundServer:
    """``with BackgroundServer(app) as server: ... server.ws_url ...``

    Listens on ``sock`` when given (a socket from ``bind_socket``), else on a socket it binds to
    ``host:port`` (port 0 or None: any free port; ``server.port`` is the one it got). The
    transport's bounds come from ``server`` (default: the config ``create_app`` left in
    ``app.state``)."""

    def __init__(self, app, host: str = "127.0.0.1", port: int | None = None, max_message_bytes: int | None = None,
                 sock: socket.socket | None = None, server: ServerConfig | None = None, log_level: str = "warning"):
        self._socket = sock if sock is not None else bind_socket(host, port or 0)
        self.host = host
        self.port = self._socket.getsockname()[1]
        server = server or getattr(getattr(app, "state", None), "server_config", None) or ServerConfig()
        if max_message_bytes is not None:
            server = dataclasses.replace(server, max_message_bytes=max_message_bytes)
        config = uvicorn_config(app, server, host, self.port, log_level=log_level, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name="voxlane-uvicorn", daemon=True)

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
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self._socket.close()

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
