"""Prometheus metrics from turn waterfalls, errors, sessions and engine statistics."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from app.metrics import Metrics


def samples(metrics: Metrics) -> dict:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_turn_waterfall_feeds_stage_histograms_and_counters():
    metrics = Metrics(engine_stats=lambda: {"queue_depth": 2, "slots_in_use": 3, "tokens_per_s": 150.0})
    metrics.on_session_opened()
    waterfall = {"gen": 1, "origin": "speech_end",
                 "ms": {"speech_end": 0.0, "turn_end_detected": 500.0, "asr_final": 650.0, "llm_request": 651.0,
                        "llm_first_token": 700.0, "first_chunk_ready": 760.0, "first_audio_out": 790.0,
                        "llm_done": 1700.0},
                 "counts": {"num_tokens": 101, "interrupted": 1}}
    metrics.on_turn_done(waterfall)
    metrics.on_error("bad_message")
    s = samples(metrics)
    assert s[("voxlane_sessions", ())] == 1
    assert s[("voxlane_turns_total", (("kind", "voice"),))] == 1
    assert s[("voxlane_interruptions_total", ())] == 1
    assert s[("voxlane_errors_total", (("code", "bad_message"),))] == 1
    assert s[("voxlane_stage_latency_seconds_sum", (("stage", "voice_to_voice"),))] == 0.79
    assert s[("voxlane_stage_latency_seconds_count", (("stage", "asr"),))] == 1
    assert abs(s[("voxlane_stage_latency_seconds_sum", (("stage", "asr"),))] - 0.15) < 1e-9
    assert ("voxlane_stage_latency_seconds_count", (("stage", "text_to_voice"),)) not in s  # not a typed turn
    assert s[("voxlane_llm_tokens_total", ())] == 101
    assert s[("voxlane_llm_tokens_per_second", ())] == 100.0  # 100 tokens after the first, in 1.0 s
    assert s[("voxlane_engine_queue_depth", ())] == 2 and s[("voxlane_engine_kv_slots_in_use", ())] == 3
    assert s[("process_resident_memory_bytes", ())] > 10_000_000
    metrics.on_session_closed()
    assert samples(metrics)[("voxlane_sessions", ())] == 0


def test_two_servers_in_one_process_keep_separate_counts():
    a, b = Metrics(), Metrics()
    a.on_error("busy")
    assert samples(a)[("voxlane_errors_total", (("code", "busy"),))] == 1
    assert ("voxlane_errors_total", (("code", "busy"),)) not in samples(b)
