"""``voxlane bench startup`` reads the phases ``voxlane serve`` logs (one serve start is tested in
tests/app/test_client.py; this checks the two agree on the line's form, with no server)."""
from __future__ import annotations

import io
import logging

from app.logs import setup_logging
from app.startup_phases import StartupPhases
from bench.startup import PHASE, StartupRun, summarize


def test_the_benchmark_parses_the_phases_the_server_logs():
    stream, level = io.StringIO(), logging.getLogger().level
    handler = setup_logging("debug", stream=stream)
    try:
        phases = StartupPhases()
        phases.record("load voice 0", 0.25)
        with phases.phase("llm weights int8"):
            pass
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger().setLevel(level)
    found = {m["name"]: float(m["seconds"]) for m in PHASE.finditer(stream.getvalue())}
    assert found.keys() == {"load voice 0", "llm weights int8"} and found["load voice 0"] == 0.25
    summary = summarize([StartupRun(2.0, found, 3.0, 800, 900), StartupRun(4.0, {"load voice 0": 0.75}, 5.0, 810, 950)])
    assert summary["ready_s"] == {"median": 3.0, "min": 2.0, "max": 4.0}
    assert summary["phases_s"]["load voice 0"]["median"] == 0.5
