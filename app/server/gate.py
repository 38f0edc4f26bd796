"""The one gate in front of the whole app (Gradio's routes, ``/v1``, ``/ws``, ``/metrics``,
``/static``): every HTTP request and WebSocket passes here before any route sees it.

In order: the ``Host`` must be one of the server's names (DNS rebinding); a browser ``Origin``
must be the server's own or configured (``server.allowed_origins``), and only those get CORS
answers; the access token, when one is set, must come with the request (``Authorization:
Bearer``, or the page's cookie; ``/ws`` may also carry it in ``start``); a body must be
announced within ``server.max_body_bytes`` and arrive whole, within it and within
``server.body_timeout_s``, before the route is called. Gradio's ``/file=<url>`` never fetches.

A browser opening ``http://host:port/#token=…`` gets a small page that trades the fragment
(never sent to the server, never logged) for an HttpOnly cookie and drops it from the address bar.
"""
from __future__ import annotations

import asyncio
import json
import logging

from starlette.datastructures import Headers

from app.config import ServerConfig
from app.server import access
from app.server import protocol as p

log = logging.getLogger(__name__)

AUTH_PATH = "/auth"  # POST with the bearer token: answered with the page's cookie
PUBLIC_PATHS = ("/healthz",)  # liveness probes: status and counts only, no token needed
CORS_METHODS = "GET, POST, OPTIONS"
CORS_HEADERS = "authorization, content-type"
# A refused body (above max_body_bytes) is still read and dropped, up to this many times the limit, before the 413
# goes out: closing a connection with unread bytes in it resets it, and the client (still sending) then lost
# the 413 (1 of ~20 uploads of 2 MB here). A client insisting on more than that gets the 413 at once.
DRAIN_LIMITS = 4
AUTHORIZED = "voxlane.authorized"  # scope key: the request carried a valid token (the /ws handler reads it)

TOKEN_PAGE = """<!doctype html><meta charset="utf-8"><title>Voxlane</title>
<body style="font-family:system-ui;max-width:36em;margin:3em auto">
<p id="m">This Voxlane server needs its access token. Open it as <code>http://HOST:PORT/#token=…</code>.</p>
<script>
(async () => {
  const token = new URLSearchParams(location.hash.slice(1)).get("token");
  history.replaceState(null, "", location.pathname + location.search);  // the token leaves the address bar
  if (!token) return;
  const r = await fetch("/auth", {method: "POST", headers: {"Authorization": "Bearer " + token}});
  if (r.ok) location.replace(location.pathname + location.search);
  else document.getElementById("m").textContent = "That access token is not valid.";
})();
</script>
"""


class Gate:
    """ASGI middleware enforcing the rules above for one ``ServerConfig``."""

    def __init__(self, app, config: ServerConfig):
        self.app = app
        self.config = config

    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        local_ip, port = (scope.get("server") or (None, None))[:2]
        if not access.is_host_allowed(headers.get("host"), self.config, local_ip):
            await self._refuse(scope, receive, send, 403, p.ErrorCode.FORBIDDEN_HOST,
                               f"Host {headers.get('host')!r} is not a name of this server (server.allowed_hosts)")
            return
        origin = headers.get("origin")
        if not access.is_origin_allowed(origin, self.config, local_ip, port):
            await self._refuse(scope, receive, send, 403, p.ErrorCode.FORBIDDEN_ORIGIN,
                               "this page's origin may not use the server (server.allowed_origins)")
            return
        if kind == "http" and scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await _send_response(send, 204, b"", self._cors_headers(origin) + [(b"access-control-max-age", b"600")])
            return
        is_ws = kind == "websocket"
        authorized = access.is_request_authorized(headers, scope.get("query_string", b""), self.config,
                                                  allow_query=is_ws and scope["path"] == "/ws")
        scope[AUTHORIZED] = authorized
        if kind == "http" and scope["path"] == AUTH_PATH and scope["method"] == "POST":
            await self._set_cookie(send, authorized)
            return
        if not authorized and scope["path"] not in PUBLIC_PATHS and not (is_ws and scope["path"] == "/ws"):
            if kind == "http" and scope["method"] == "GET" and "text/html" in headers.get("accept", ""):
                await _send_response(send, 401, TOKEN_PAGE.encode(), [(b"content-type", b"text/html; charset=utf-8"),
                                                                        (b"cache-control", b"no-store")])
                return
            await self._refuse(scope, receive, send, 401, p.ErrorCode.UNAUTHORIZED,
                               "a valid access token is required (Authorization: Bearer)",
                               [(b"www-authenticate", b"Bearer")])
            return
        if kind == "http" and access.is_remote_url(scope["path"]):
            await self._refuse(scope, receive, send, 403, "forbidden", "this server does not fetch remote URLs")
            return
        if kind == "http":
            receive = await self._read_body(scope, receive, send, headers)
            if receive is None:
                return
            send = self._with_cors(send, origin)
        await self.app(scope, receive, send)

    # --- bodies -------------------------------------------------------------------------------

    async def _read_body(self, scope, receive, send, headers):
        """The whole body, within max_body_bytes and body_timeout_s, before the route runs; returns
        a ``receive`` that replays it (then passes the client's disconnect on), or None if refused."""
        limit = self.config.max_body_bytes
        length = headers.get("content-length")
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        if length is None and not chunked:
            return receive  # no body
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.body_timeout_s  # the whole body's, a refused one's drain included
        if length is not None:
            if not length.isdigit():
                await _send_json_error(send, 400, "bad_request", "Content-Length is not a number")
                return None
            if int(length) > limit:
                if int(length) <= DRAIN_LIMITS * limit:
                    await self._drain(receive, 0, deadline)
                await _send_json_error(send, 413, "too_large",
                                       f"a request body of {int(length)} bytes is above server.max_body_bytes ({limit})")
                return None
        body = bytearray()
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                await _send_json_error(send, 408, "timeout",
                                       f"the request body did not arrive within {self.config.body_timeout_s:g} s "
                                       "(server.body_timeout_s)")
                return None
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            if len(body) > limit:
                if message.get("more_body", False):
                    await self._drain(receive, len(body), deadline)
                await _send_json_error(send, 413, "too_large", f"a request body above server.max_body_bytes ({limit})")
                return None
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        return replay

    async def _drain(self, receive, read: int, deadline: float) -> None:
        """Reads and drops the rest of a refused body (``read`` bytes of it already in), within DRAIN_LIMITS x
        max_body_bytes and the body's deadline (the event loop's clock): see DRAIN_LIMITS."""
        loop = asyncio.get_running_loop()
        while read <= DRAIN_LIMITS * self.config.max_body_bytes:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                return
            if message["type"] != "http.request":
                return
            read += len(message.get("body", b""))
            if not message.get("more_body", False):
                return

    # --- CORS: one policy, only the server's own and configured origins ------------------------

    def _cors_headers(self, origin: str | None) -> list[tuple[bytes, bytes]]:
        if origin is None:
            return []
        return [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin"),
                (b"access-control-allow-methods", CORS_METHODS.encode()),
                (b"access-control-allow-headers", CORS_HEADERS.encode())]

    def _with_cors(self, send, origin: str | None):
        """Drops whatever CORS headers a route (Gradio's middleware) set and adds the gate's own."""
        extra = self._cors_headers(origin)[:2]

        async def sender(message):
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if not k.lower().startswith(b"access-control-")]
                message = {**message, "headers": kept + extra}
            await send(message)

        return sender

    # --- refusals -----------------------------------------------------------------------------

    async def _set_cookie(self, send, authorized: bool) -> None:
        if not authorized or not self.config.access_token:
            await _send_json_error(send, 401, p.ErrorCode.UNAUTHORIZED, "a valid access token is required")
            return
        cookie = (f"{access.COOKIE_NAME}={access.cookie_value(self.config)}; Path=/; HttpOnly; SameSite=Strict")
        await _send_response(send, 204, b"", [(b"set-cookie", cookie.encode())])

    async def _refuse(self, scope, receive, send, status: int, code: str, message: str, extra=()) -> None:
        log.info("refused %s %s: %s", scope["type"], scope["path"], message)
        if scope["type"] == "http":
            await _send_json_error(send, status, code, message, list(extra))
            return
        # A WebSocket: the protocol's JSON error and close code, so a client can say why.
        if (await receive())["type"] != "websocket.connect":
            return
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send", "text": p.encode(p.error_message(code, message))})
        await send({"type": "websocket.close", "code": p.CLOSE_CODES.get(code, 1008), "reason": message[:120]})


async def _send_response(send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    headers = headers + [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_json_error(send, status: int, code: str, message: str, extra=None) -> None:
    """OpenAI-style error bodies, which /v1 clients parse and other clients can read."""
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "code": code}}).encode()
    await _send_response(send, status, body, [(b"content-type", b"application/json"), (b"connection", b"close")]
                         + list(extra or []))
