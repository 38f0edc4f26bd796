"""Loads independent models at the same time, each on a thread of its own, all or nothing.

Loading is mostly reading files, building ONNX Runtime or CTranslate2 sessions and waiting for the
engine's own thread (which alone runs torch's thread team, engine/step_loop.py): work that leaves
the GIL and overlaps well on two cores, where one after the other it added up (README, "Cold
start"). If one load fails, the others are still waited for, the ones that loaded are closed, and
one error names the model that failed and why: nothing half-loaded stays behind.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from app.startup_phases import StartupPhases

log = logging.getLogger(__name__)


class ModelLoadError(RuntimeError):
    """One or more models could not load; ``failed`` maps each one's label to its exception."""

    def __init__(self, failed: dict[str, BaseException]):
        self.failed = failed
        super().__init__("; ".join(f"could not load the {label}: {type(error).__name__}: {error}"
                                   for label, error in failed.items()))


@dataclass(frozen=True)
class ModelLoad:
    """One model to load: ``load()`` returns it (loaded and warmed, as the caller wants it);
    ``close(model)`` frees it if another load fails (None: dropping the reference frees it)."""

    label: str  # names the model in errors and phases, e.g. "LLM (smollm2-135m-instruct)"
    load: Callable[[], Any]
    close: Callable[[Any], None] | None = None


def load_in_parallel(loads: dict[str, ModelLoad], phases: StartupPhases | None = None) -> dict[str, Any]:
    """Every load on its own thread; returns {key: model} once all are done. Each load's wall time
    is recorded as phase ``load <key>``. Raises ModelLoadError (the loaded ones closed) when any fails."""
    phases = phases or StartupPhases()

    def timed(key: str, load: ModelLoad):
        started = time.monotonic()
        try:
            return load.load()
        finally:
            phases.record(f"load {key}", time.monotonic() - started)

    with ThreadPoolExecutor(max_workers=max(1, len(loads)), thread_name_prefix="voxlane-load") as pool:
        futures = {key: pool.submit(timed, key, load) for key, load in loads.items()}
    loaded = {key: f.result() for key, f in futures.items() if f.exception() is None}
    failed = {loads[key].label: f.exception() for key, f in futures.items() if f.exception() is not None}
    if not failed:
        return loaded
    for key, model in loaded.items():
        close = loads[key].close
        if close is not None:
            try:
                close(model)
            except Exception as error:  # keep freeing the rest; the load error is what the user needs
                log.warning("closing %s after a failed start: %s", loads[key].label, error)
    raise ModelLoadError(failed)
