"""What ``gc.freeze()`` after warm-up changes (issue 11, finding 2), on the heap ``voxlane serve``
has once its models are loaded and warmed:

    python -m tests.app.gc_freeze_figures [--json]

Prints the objects the collector tracks and how long a full collection takes, before and after
the freeze, and how long parsing one pre-start flood frame (1 MiB of nested empty lists) takes
with the collections it triggers. A measurement, not a test (state the load average with it).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time


def full_collection_ms(n: int = 5) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def flood_frame_parse_ms(n: int = 5) -> float:
    """json.loads of a 1 MiB frame of nested empty lists: ~350,000 new objects, so the collector runs."""
    frame = "[" + ",".join(["[]"] * ((1 << 20) // 3 - 2)) + "]"
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        json.loads(frame)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from app.config import load_config
    from app.server.app import create_app
    from app.pipeline_sessions import PipelineSessions

    config = load_config(None, environ={})
    factory = PipelineSessions(config)
    factory.warm_up()
    create_app(config, factory, with_ui=True)  # Gradio's objects are part of serve's heap too
    figures = {"load_average": os.getloadavg()}
    gc.collect()
    figures["tracked_objects"] = len(gc.get_objects())
    figures["full_collection_ms"] = full_collection_ms()
    figures["flood_frame_parse_ms"] = flood_frame_parse_ms()
    gc.freeze()
    figures["frozen_objects"] = gc.get_freeze_count()
    figures["tracked_objects_after_freeze"] = len(gc.get_objects())
    figures["full_collection_ms_after_freeze"] = full_collection_ms()
    figures["flood_frame_parse_ms_after_freeze"] = flood_frame_parse_ms()
    figures["load_average_after"] = os.getloadavg()
    factory.close()
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    result = main()
    if parser.parse_args().json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:36} {value}")
