"""One WebSocket session: its pipeline (a ``VoiceSession``), and the thread that carries output
frames from the pipeline's threads onto the event loop as protocol messages.

asyncio stops here: the pipeline runs on threads and is only ever called with plain methods; its
output reaches the loop through ``run_coroutine_threadsafe`` on a bounded queue, so a slow client
slows the pump (backpressure) instead of growing memory.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import threading

from app.server.events import StateTracker, audio_messages, to_messages
from app.server.limits import TurnWatch
from app.server.voice_session import VoiceSession
from pipeline import frames as f

log = logging.getLogger(__name__)

CLOSED = object()  # put on the queue when the pump stops: the sender ends
OUT_QUEUE_SIZE = 256  # messages; a few seconds of audio chunks


class Session:
    """A started session. ``outbox`` holds JSON dicts and (audio header, PCM bytes) pairs."""

    def __init__(self, session_id: str, pipeline: VoiceSession, input_rate_hz: int,
                 loop: asyncio.AbstractEventLoop, stall_timeout_s: float = 20.0):
        self.id = session_id
        self.pipeline = pipeline  # it holds the persona, and checks a new one
        self.input_rate_hz = input_rate_hz
        self.loop = loop
        self.outbox: asyncio.Queue = asyncio.Queue(maxsize=OUT_QUEUE_SIZE)
        # Audio of a turn older than this is dropped at the socket, even if already queued: an
        # interruption must stop the sound within one chunk, not after the queue drains.
        self.min_audio_gen = 0
        self.latest_gen = 0
        self.num_audio_bytes_in = 0
        self._state = StateTracker()
        self._watch = TurnWatch(stall_timeout_s)
        self.num_timeouts = 0
        self._tts_failed_gen = -1  # the last turn whose speech failed: its apology is shown, not spoken
        self._stop = threading.Event()
        # The pump runs in this connection's context, so its log lines name the session (app/logs.py).
        self._pump = threading.Thread(target=contextvars.copy_context().run, args=(self._run,),
                                      name=f"voxlane-{session_id}-pump", daemon=True)
        self._pump.start()

    # --- pipeline thread side ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                frame = self.pipeline.next_frame(0.1)
                if frame is None:
                    if (stalled := self._watch.stalled()) is not None:
                        self._end_stalled_turn(*stalled)
                    continue
                self._watch.on_frame(frame)
                self.latest_gen = max(self.latest_gen, frame.gen)
                if isinstance(frame, f.ErrorFrame) and frame.stage == "tts":
                    self._tts_failed_gen = frame.gen
                if isinstance(frame, f.Interrupt):
                    self.min_audio_gen = max(self.min_audio_gen, frame.gen)
                change = self._state.update(frame)
                if change:  # before the frame's own messages: "speaking" arrives with the first audio
                    self._put(change)
                if isinstance(frame, f.AudioOut):
                    self._put(audio_messages(frame))  # (header, pcm): sent back to back
                else:
                    for message in to_messages(frame):
                        self._put(message)
        except Exception:  # a pump bug must end the session visibly, not hang it
            log.exception("session %s: output pump failed", self.id)  # the sender then ends the session
        finally:
            self._put(CLOSED)

    def _end_stalled_turn(self, gen: int, stage: str) -> None:
        """A stage stopped producing: show the apology, cancel the turn (its generation and slot,
        the synthesis in flight), and close it with a ``turn`` message, so the client is never left
        waiting in silence. The apology is also spoken, as a turn of its own right after, unless
        the voice itself is what stalled or failed in this turn: then it is only shown."""
        log.warning("session %s: turn %d stalled in %s; ending it", self.id, gen, stage)
        self.num_timeouts += 1
        apology = "Sorry, I could not answer in time. Please try again."
        self._put({"type": "error", "code": "timeout", "gen": gen, "stage": stage, "fatal": False,
                   "message": f"{apology} (The {stage} stage stalled.)"})
        # The notice's frames come through this pump, so after the stalled turn's "turn" message below.
        self.interrupt(notice=None if stage == "tts" or self._tts_failed_gen == gen else apology, reason="timeout")
        self._put({"type": "turn", "gen": gen, "waterfall": {"gen": gen, "ms": {}, "counts": {"timed_out": 1}}})
        self._state.state = "listening"
        self._put({"type": "state", "gen": gen, "state": "listening"})

    def _put(self, item) -> None:
        """Hand one message to the event loop, waiting while the outbox is full (until closed)."""
        if self.loop.is_closed():
            return
        future = asyncio.run_coroutine_threadsafe(self.outbox.put(item), self.loop)
        while True:
            try:
                future.result(timeout=0.25)
                return
            except concurrent.futures.TimeoutError:
                if self._stop.is_set():  # nobody reads any more: the session is going away
                    future.cancel()
                    return

    # --- event loop side --------------------------------------------------------------------

    def interrupt(self, notice: str | None = None, reason: str = "user") -> None:
        """The client asked to stop (or a stalled turn ends: ``reason`` "timeout", and ``notice``
        is said instead if given): drop this turn's queued audio now, then stop the pipeline."""
        self.min_audio_gen = max(self.min_audio_gen, self.latest_gen + 1)
        if notice is None:
            self.pipeline.interrupt(reason)
        else:
            self.pipeline.speak_notice(notice)

    def is_stale(self, header: dict) -> bool:
        return header["gen"] < self.min_audio_gen

    def close(self) -> None:
        """Blocking: stop the pump and the pipeline (threads, engine slot). Call via to_thread."""
        self._stop.set()
        try:
            self.pipeline.close()
        finally:
            self._pump.join(timeout=10)
            if self._pump.is_alive():
                log.warning("session %s: pump thread did not stop", self.id)
