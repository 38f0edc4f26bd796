"""The ``/ws`` endpoint: one WebSocket = one session, speaking docs/protocol.md.

Reading happens here, on the event loop; writing happens in one sender task per socket (the only
writer, so messages never interleave); the pipeline lives on its own threads (app/server/session.py).
Whatever ends the socket — "end", a disconnect mid-answer, an error, a client too slow to read
its answers, the session's time limit — the ``finally`` frees the pipeline's threads, its engine
slot and the session's place.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging

import numpy as np
from fastapi import WebSocket, WebSocketDisconnect

from app.config import ServerConfig
from app.logs import SESSION
from app.metrics import Metrics
from app.server import protocol as p
from app.server.access import is_token_valid
from app.server.gate import AUTHORIZED
from app.server.limits import TokenBucket
from app.server.registry import SessionLimitReached, SessionRegistry
from app.server.session import CLOSED, Session
from app.server.voice_session import VoiceSessionFactory

log = logging.getLogger(__name__)

AUDIO_BURST_S = 60.0  # audio a client may send ahead of real time x max_audio_speed (a WAV sent fast)
RATE_ERROR_INTERVAL_S = 1.0  # at most one "rate_limited" answer per second: refusals must not flood either


class _Closed(Exception):
    """The client went away or sent "end"."""


class SocketHandler:
    """Serves one WebSocket connection from accept to close."""

    def __init__(self, websocket: WebSocket, config: ServerConfig, factory: VoiceSessionFactory,
                 registry: SessionRegistry, metrics: Metrics | None = None):
        self.ws = websocket
        self.config = config
        self.factory = factory
        self.registry = registry
        self.metrics = metrics or Metrics()
        self.session: Session | None = None
        self.session_id: str | None = None
        self._sender: asyncio.Task | None = None
        self._task: asyncio.Task | None = None
        self._drop: p.ProtocolError | None = None  # why the server ends this session on its own
        self._expiry: asyncio.TimerHandle | None = None
        self._messages = TokenBucket(config.max_messages_per_s, 2 * config.max_messages_per_s)
        self._audio = TokenBucket(config.max_audio_speed, AUDIO_BURST_S)
        self._last_rate_error = -RATE_ERROR_INTERVAL_S
        self.client = websocket.client.host if websocket.client else ""
        self._is_pending = False

    async def run(self) -> None:
        self._task = asyncio.current_task()
        try:
            await self._run()
        finally:
            self._leave_pending()

    async def _run(self) -> None:
        await self.ws.accept()
        try:
            try:  # a socket holds a small "not started" place until its "start" is accepted
                self.registry.enter_pending(self.client)
                self._is_pending = True
            except SessionLimitReached as error:
                raise p.ProtocolError(p.ErrorCode.BUSY, str(error)) from None
            await self._serve()
        except (_Closed, WebSocketDisconnect):
            pass
        except p.ProtocolError as error:  # only fatal ones get here
            await self._fail(error.code, error.message)
        except asyncio.CancelledError:
            if self._drop is None:  # the server is shutting down
                raise
            self._task.uncancel()  # our own cancel (slow client, expired session): end it cleanly
            await self._fail(self._drop.code, self._drop.message)
        except Exception:
            log.exception("session %s failed", self.session_id)
            await self._fail(p.ErrorCode.INTERNAL, "internal server error")
        finally:
            await self._cleanup()

    def _leave_pending(self) -> None:
        if self._is_pending:
            self._is_pending = False
            self.registry.leave_pending(self.client)

    def _end_session(self, code: str, message: str) -> None:
        """Ends the session from outside the reader (the sender, a timer): cancels the reader,
        whose ``run`` then sends the fatal error and cleans up."""
        if self._drop is None and self._task is not None and not self._task.done():
            log.warning("session %s: ending it: %s", self.session_id, message)
            self._drop = p.ProtocolError(code, message)
            self._task.cancel()

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        start_deadline = loop.time() + self.config.start_timeout_s  # for the whole phase, not per message
        while True:
            timeout = None if self.session is not None else max(0.0, start_deadline - loop.time())
            try:
                message = await asyncio.wait_for(self.ws.receive(), timeout)
            except asyncio.TimeoutError:
                raise p.ProtocolError(p.ErrorCode.NOT_STARTED, "no 'start' message in time") from None
            if message["type"] == "websocket.disconnect":
                raise _Closed
            try:
                await self._handle(message)
            except p.ProtocolError as error:
                if error.is_fatal:
                    raise
                if error.code == p.ErrorCode.RATE_LIMITED:
                    now = loop.time()
                    if now - self._last_rate_error < RATE_ERROR_INTERVAL_S:
                        continue  # dropped quietly: one answer per second is enough
                    self._last_rate_error = now
                await self._send_now(p.error_message(error.code, error.message))

    def _check_size(self, data: bytes | None, text: str | None) -> None:
        """Per phase, by size alone (nothing is parsed yet): before "start" a few KiB; after it, text
        frames near what a text turn needs and audio up to max_message_bytes."""
        size = len(data) if data is not None else len(text or "")  # bytes of audio, characters of text (O(1))
        if self.session is None:
            limit, what = p.MAX_START_BYTES, "before 'start'"
        elif data is None:
            limit, what = min(p.MAX_TEXT_FRAME_BYTES, self.config.max_message_bytes), "for a text message"
        else:
            limit, what = self.config.max_message_bytes, "(server.max_message_bytes)"
        if size > limit:
            unit = "bytes" if data is not None else "characters"
            raise p.ProtocolError(p.ErrorCode.TOO_LARGE, f"a message of {size} {unit} is above {limit} {what}")

    async def _handle(self, message: dict) -> None:
        data, text = message.get("bytes"), message.get("text")
        self._check_size(data, text)
        if data is not None:
            if self.session is None:
                raise p.ProtocolError(p.ErrorCode.NOT_STARTED, "send 'start' before audio")
            p.check_audio_frame(data)
            if not self._audio.take(len(data) / 2 / self.session.input_rate_hz):
                raise p.ProtocolError(p.ErrorCode.RATE_LIMITED,
                                      f"audio arrives faster than {self.config.max_audio_speed:g}x real time "
                                      "(server.max_audio_speed); frames are dropped")
            self.session.num_audio_bytes_in += len(data)
            # Never waits on the event loop: a pipeline too slow to take audio loses it (counted).
            if not self.session.pipeline.push_audio(np.frombuffer(data, dtype="<i2"), self.session.input_rate_hz,
                                                    block=False):
                self.metrics.on_audio_dropped()
            return
        if not self._messages.take():
            raise p.ProtocolError(p.ErrorCode.RATE_LIMITED,
                                  f"more than {self.config.max_messages_per_s:g} messages per second "
                                  "(server.max_messages_per_s); messages are dropped")
        request = p.parse_client_text(text or "")
        if isinstance(request, p.Start):
            await self._start(request)
            return
        if self.session is None:
            raise p.ProtocolError(p.ErrorCode.NOT_STARTED, "the first message must be 'start'")
        if isinstance(request, p.TextInput):
            self.session.pipeline.text_input(request.text)
            await self._send_now({"type": "state", "gen": self.session.latest_gen, "state": "thinking"})
        elif isinstance(request, p.Interrupt):
            self.session.interrupt()
        elif isinstance(request, p.SetPersona):
            self._check_persona(request.persona)
            self.session.pipeline.set_persona(request.persona)
            await self._send_now({"type": "persona", "persona": request.persona, "applies": "next_turn"})
        elif isinstance(request, p.Played):
            self.session.pipeline.report_playback(request.gen, request.samples)
        elif isinstance(request, p.End):
            raise _Closed

    def _check_persona(self, name: str) -> None:
        if name not in self.factory.persona_names():
            raise p.ProtocolError(p.ErrorCode.UNKNOWN_PERSONA,
                                  f"no persona {name!r}; available: {', '.join(self.factory.persona_names())}")

    async def _start(self, request: p.Start) -> None:
        if self.session is not None:
            raise p.ProtocolError(p.ErrorCode.ALREADY_STARTED, "this socket's session is already started")
        # The gate already checked the connection's own token (header, cookie, ?token=).
        if not (self.ws.scope.get(AUTHORIZED) or is_token_valid(request.token, self.config)):
            raise p.ProtocolError(p.ErrorCode.UNAUTHORIZED, "a valid access token is required (server.access_token)")
        persona = request.persona or self.factory.default_persona()
        self._check_persona(persona)
        try:
            self.session_id = self.registry.acquire()
        except SessionLimitReached as error:
            raise p.ProtocolError(p.ErrorCode.BUSY, str(error)) from None
        self._leave_pending()  # a session's place now, counted against max_sessions
        SESSION.set(self.session_id)  # log lines of this connection (and of threads started here) name it
        self.metrics.on_session_opened()
        # One id for the user everywhere: the registry's place, the pipeline, the LLM's KV slot, the logs.
        pipeline = await asyncio.to_thread(self.factory.open, persona, self.session_id)  # starts threads: off the loop
        loop = asyncio.get_running_loop()
        self.session = Session(self.session_id, pipeline, request.sample_rate, loop,
                               stall_timeout_s=self.config.stall_timeout_s)
        self._expiry = loop.call_later(self.config.max_session_s, self._end_session, p.ErrorCode.SESSION_EXPIRED,
                                       f"a session lasts at most {self.config.max_session_s:g} s "
                                       "(server.max_session_s); start a new one")
        log.info("session %s started (persona %s, input %d Hz)", self.session_id, persona, request.sample_rate)
        await self._send_now({"type": "ready", "version": p.VERSION, "session": self.session_id,
                              "persona": persona, "personas": self.factory.persona_names(),
                              "input_sample_rate": request.sample_rate, "audio_format": "pcm16le",
                              "max_message_bytes": self.config.max_message_bytes})
        self._sender = asyncio.create_task(self._send_loop())

    # --- writing ----------------------------------------------------------------------------

    def _note(self, message: dict) -> None:
        """Every JSON message out passes here once: errors and finished turns feed the metrics."""
        kind = message.get("type")
        if kind == "error":
            self.metrics.on_error(message.get("code", "unknown"))
        elif kind == "turn":
            self.metrics.on_turn_done(message.get("waterfall") or {})

    async def _send_now(self, message: dict) -> None:
        """Replies to the client's own messages; before the sender starts, or through it after."""
        if self._sender is None:
            self._note(message)
            await asyncio.wait_for(self.ws.send_text(p.encode(message)), self.config.send_timeout_s)
        else:
            await self.session.outbox.put(message)

    async def _send(self, send, payload) -> None:
        """One write; a client that has not read for send_timeout_s (its buffers are full) is dropped."""
        try:
            await asyncio.wait_for(send(payload), self.config.send_timeout_s)
        except asyncio.TimeoutError:
            self._end_session(p.ErrorCode.SLOW_CLIENT,
                              f"the client read nothing for {self.config.send_timeout_s:g} s (server.send_timeout_s)")
            raise _Closed from None

    async def _send_loop(self) -> None:
        session = self.session
        try:
            while True:
                item = await session.outbox.get()
                if item is CLOSED:  # the pump stopped on its own (a bug): end the session visibly
                    self._end_session(p.ErrorCode.INTERNAL, "the session's output failed (logged)")
                    return
                if isinstance(item, tuple):
                    header, pcm = item
                    if session.is_stale(header):
                        continue
                    await self._send(self.ws.send_text, p.encode(header))
                    await self._send(self.ws.send_bytes, pcm)
                else:
                    self._note(item)
                    await self._send(self.ws.send_text, p.encode(item))
        except (WebSocketDisconnect, RuntimeError, _Closed):  # the socket closed under us: the reader ends too
            pass

    async def _fail(self, code: str, message: str) -> None:
        """A fatal error: say why (unless the client cannot even read that), then close."""
        if self._sender is not None:
            self._sender.cancel()
        self.metrics.on_error(code)
        log.info("session %s: closing with %s: %s", self.session_id, code, message)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.send_text(p.encode(p.error_message(code, message))), 2.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(code=p.CLOSE_CODES.get(code, 1008), reason=message[:120]), 2.0)

    async def _cleanup(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(BaseException):
                await self._sender
        if self.session is not None:
            await asyncio.to_thread(self.session.close)  # joins threads: never on the loop
        if self.session_id is not None:
            self.registry.release(self.session_id)
            self.metrics.on_session_closed()
            log.info("session %s ended", self.session_id)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(), 2.0)
