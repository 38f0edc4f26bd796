"""Prometheus metrics for one server: sessions, turns, errors by code, per-stage latency from the
turn waterfalls, LLM throughput, engine queue and KV slots, process memory. ``render()`` is the
body of ``GET /metrics``. One registry per server (no module-level globals), so tests can run
several servers in one process."""
from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS_S = (0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)

# stage name -> (from mark, to mark) in a turn waterfall (pipeline.waterfall)
STAGES = {
    "endpointing": ("speech_end", "turn_end_detected"),
    "asr": ("turn_end_detected", "asr_final"),
    "llm_first_token": ("llm_request", "llm_first_token"),
    "first_chunk": ("llm_first_token", "first_chunk_ready"),
    "tts_first_audio": ("first_chunk_ready", "first_audio_out"),
    "voice_to_voice": ("speech_end", "first_audio_out"),
    "text_to_voice": ("text_in", "first_audio_out"),
    "first_audio_played": ("speech_end", "first_audio_played"),
}

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """The server's metrics; call the ``on_*`` methods as things happen."""

    def __init__(self, engine_stats: Callable[[], dict] | None = None):
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, cpu, open fds
        r = self.registry
        self.sessions = Gauge("voxlane_sessions", "Open sessions", registry=r)
        self.sessions_total = Counter("voxlane_sessions_opened", "Sessions opened", registry=r)
        self.turns = Counter("voxlane_turns", "Finished turns", ["kind"], registry=r)
        self.interruptions = Counter("voxlane_interruptions", "Turns cut short by barge-in or interrupt", registry=r)
        self.errors = Counter("voxlane_errors", "Errors sent to clients, by code", ["code"], registry=r)
        self.stage_latency = Histogram("voxlane_stage_latency_seconds", "Per-stage latency from turn waterfalls",
                                       ["stage"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.audio_dropped = Counter("voxlane_audio_frames_dropped", "Client audio frames dropped because a "
                                     "session's pipeline could not take them", registry=r)
        self.llm_tokens = Counter("voxlane_llm_tokens", "Tokens generated for turns", registry=r)
        self.llm_tokens_per_s = Gauge("voxlane_llm_tokens_per_second", "Decode rate of the last turn", registry=r)
        self._engine_stats = engine_stats
        self.engine_queue = Gauge("voxlane_engine_queue_depth", "Requests waiting for the engine", registry=r)
        self.engine_slots = Gauge("voxlane_engine_kv_slots_in_use", "KV-cache slots running a sequence", registry=r)
        self.engine_slots_held = Gauge("voxlane_engine_kv_slots_held", "KV-cache slots kept by conversations",
                                       registry=r)
        self.engine_slots_total = Gauge("voxlane_engine_kv_slots", "KV-cache slots in the engine", registry=r)
        self.engine_tokens_per_s = Gauge("voxlane_engine_tokens_per_second", "Engine decode throughput", registry=r)

    def on_session_opened(self) -> None:
        self.sessions.inc()
        self.sessions_total.inc()

    def on_session_closed(self) -> None:
        self.sessions.dec()

    def on_audio_dropped(self) -> None:
        self.audio_dropped.inc()

    def on_error(self, code: str) -> None:
        self.errors.labels(code=code).inc()

    def on_turn_done(self, waterfall: dict) -> None:
        """Records a finished turn from its waterfall dict (``TurnDone.waterfall``)."""
        ms = waterfall.get("ms", {})
        counts = waterfall.get("counts", {})
        if counts.get("notice"):  # the server speaking for itself (an apology), not a user's turn
            return
        self.turns.labels(kind="voice" if waterfall.get("origin") == "speech_end" else "text").inc()
        if counts.get("interrupted"):
            self.interruptions.inc()
        for stage, (start, end) in STAGES.items():
            if start in ms and end in ms and ms[end] >= ms[start]:
                self.stage_latency.labels(stage=stage).observe((ms[end] - ms[start]) / 1000)
        tokens = counts.get("num_tokens", 0)
        if tokens:
            self.llm_tokens.inc(tokens)
            if "llm_first_token" in ms and "llm_done" in ms and ms["llm_done"] > ms["llm_first_token"] and tokens > 1:
                self.llm_tokens_per_s.set((tokens - 1) / ((ms["llm_done"] - ms["llm_first_token"]) / 1000))

    def render(self) -> bytes:
        if self._engine_stats is not None:
            stats = self._engine_stats()
            self.engine_queue.set(stats.get("queue_depth", 0))
            self.engine_slots.set(stats.get("slots_in_use", 0))
            self.engine_tokens_per_s.set(stats.get("tokens_per_s", 0.0))
            self.engine_slots_held.set(stats.get("slots_held", 0))
            self.engine_slots_total.set(stats.get("num_slots", 0))
        return generate_latest(self.registry)
