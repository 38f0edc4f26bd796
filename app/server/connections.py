"""Connection-level bounds uvicorn lacks, and the one place ``uvicorn.Config`` is built.

uvicorn (h11) waits for a request's headers forever and accepts any number of connections: 300
slow-loris sockets that each sent half a request line stayed open (server fds 15 -> 315). Its
HTTP/1.1 protocol here gets a deadline for the headers of each request (from connect, and again
after each response on a kept-alive connection) and closes a connection beyond
``server.max_connections`` at once. Bodies are bounded by the gate (app/server/gate.py).
"""
from __future__ import annotations

import asyncio

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from app.config import ServerConfig
from app.logs import hide_query_strings

BUSY_RESPONSE = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


def bounded_protocol(max_connections: int, header_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's H11Protocol with a header deadline and a cap on open connections (HTTP and
    WebSocket: uvicorn's WebSocket protocols join the same ``connections`` set)."""

    class BoundedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                self.logger.warning("%d connections are open (server.max_connections): closing a new one",
                                    len(self.connections) - 1)
                transport.write(BUSY_RESPONSE)
                transport.close()
                return
            self._arm_header_timer()

        def connection_lost(self, exc) -> None:
            self._disarm_header_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # this request's headers are in
                self._disarm_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_header_timer()  # the next request on a kept-alive connection has its own deadline

        def _arm_header_timer(self) -> None:
            self._disarm_header_timer()
            self._header_timer = self.loop.call_later(header_timeout_s, self._on_header_timeout)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _on_header_timeout(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return BoundedH11Protocol


def uvicorn_config(app, server: ServerConfig, host: str, port: int, **options) -> uvicorn.Config:
    """Every bound the transport enforces. WebSocket messages above 4x ``max_message_bytes`` are
    refused by the transport unread (close 1009); smaller oversized ones get a JSON error from the
    handler. Request headers above h11's 16 KiB get 400. Access log lines never carry a query
    string (it may hold the token)."""
    config = uvicorn.Config(app, host=host, port=port, http=bounded_protocol(server.max_connections,
                                                                             server.header_timeout_s),
                            timeout_keep_alive=5, ws_max_size=4 * server.max_message_bytes,
                            ws_per_message_deflate=False, **options)
    hide_query_strings()  # after Config, which (re)configures uvicorn's loggers
    return config
