"""``voxlane bench startup``: cold start, from ``voxlane serve`` to ``/healthz`` answering 200.

    voxlane bench startup [--repeat 3] [--cold] [--json] [-- SERVE ARGS ...]

Each run starts ``voxlane serve --port 0 --log-level debug`` as a user would (its own process,
the configured models, the shipped personas only), times it to the first ``/healthz`` 200 (models
loaded and warmed: the server answers only after its warm-up), reads the server's own per-phase
log lines (``startup: ...``, app/startup_phases.py) and its resident memory (RSS, and the peak,
VmHWM) once ready, then stops it. ``--cold`` first drops the model files from the OS page cache
(``posix_fadvise(DONTNEED)``; pages another process maps stay), so the run reads them from disk.
The machine is shared: the load average is printed with the figures; compare medians.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVING = re.compile(r"voxlane: serving on (http://\S+)")
PHASE = re.compile(r'msg="startup: (?P<name>[\w .-]+?) (?P<seconds>[0-9.]+) s"')


@dataclass
class StartupRun:
    """One start of ``voxlane serve``: wall seconds to ready, the server's phases and memory."""

    ready_s: float
    phases: dict[str, float] = field(default_factory=dict)  # name -> seconds, as the server logged them
    cpu_s: float = 0.0  # the server's user + system CPU seconds until ready (all its threads)
    rss_mib: float = 0.0
    peak_rss_mib: float = 0.0


def evict_from_page_cache(paths: list[Path]) -> int:
    """Asks the OS to drop these files' cached pages (directories: every file inside); bytes asked."""
    files = [f for p in paths for f in ([p] if p.is_file() else sorted(p.rglob("*")) if p.is_dir() else [])
             if f.is_file()]
    total = 0
    for path in files:
        with open(path, "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            total += path.stat().st_size
    return total


def model_paths(root: Path = ROOT) -> list[Path]:
    """The resolved files of the configured models (what ``--cold`` evicts)."""
    from app.config import load_config
    from app.model_store import resolve

    models = load_config().models
    specs = ((models.asr, "asr"), (models.llm, "llm"), (models.tts, "tts"), (models.vad, "vad"), (models.turn, "turn"))
    paths = [resolve(spec, kind).resolve() for spec, kind in specs]
    return [p.parent if p.is_file() and kind == "tts" else p for p, (_, kind) in zip(paths, specs)]


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (its children excluded)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def _memory_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process, MiB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) / 1024
    return found.get("VmRSS", 0.0), found.get("VmHWM", 0.0)


def measure_start(root: Path = ROOT, serve_args: tuple[str, ...] = (), timeout_s: float = 300.0) -> StartupRun:
    """Start ``voxlane serve`` from the source tree ``root``, wait for ``/healthz``, measure, stop it."""
    import httpx

    with tempfile.TemporaryDirectory(prefix="voxlane-startup-") as folder:
        log_path = Path(folder) / "serve.log"
        personas = Path(folder) / "personas"  # empty: this user's own personas are not loaded
        personas.mkdir()
        env = dict(os.environ, PYTHONPATH=str(root), GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1",
                   VOXLANE_PERSONAS_USER_DIR=str(personas))
        with open(log_path, "w") as log:
            started = time.monotonic()
            process = subprocess.Popen([sys.executable, "-m", "app", "serve", "--port", "0", "--log-level", "debug",
                                        *serve_args], cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = ""
            while True:
                if time.monotonic() - started > timeout_s:
                    raise TimeoutError(f"voxlane serve not ready after {timeout_s} s:\n{log_path.read_text()[-2000:]}")
                if process.poll() is not None:
                    raise RuntimeError(f"voxlane serve exited with {process.returncode}:\n"
                                       f"{log_path.read_text()[-2000:]}")
                if not url and (found := SERVING.search(log_path.read_text(errors="replace"))):
                    url = found.group(1)
                if url:
                    try:
                        if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass  # printed just before uvicorn accepts
                time.sleep(0.02)
            ready_s = time.monotonic() - started
            cpu_s = _cpu_s(process.pid)
            rss, peak = _memory_mib(process.pid)
            text = log_path.read_text(errors="replace")
            phases = {m["name"]: float(m["seconds"]) for m in PHASE.finditer(text)}
            return StartupRun(ready_s, phases, cpu_s, rss, peak)
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def summarize(runs: list[StartupRun]) -> dict:
    """Median, min and max of the wall time, the memory and each phase."""
    def stats(values: list[float]) -> dict:
        return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
                "max": round(max(values), 3)}

    phases = sorted({name for run in runs for name in run.phases})
    return {"ready_s": stats([r.ready_s for r in runs]), "cpu_s": stats([r.cpu_s for r in runs]), "rss_mib": stats([r.rss_mib for r in runs]),
            "peak_rss_mib": stats([r.peak_rss_mib for r in runs]),
            "phases_s": {name: stats([r.phases[name] for r in runs if name in r.phases]) for name in phases}}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    serve_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="voxlane bench startup", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3, help="starts to time (default 3)")
    p.add_argument("--cold", action="store_true", help="drop the model files from the page cache before each start")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one start may take")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    runs = []
    for i in range(args.repeat):
        if args.cold:
            evict_from_page_cache(model_paths())
        runs.append(measure_start(ROOT, tuple(serve_args), args.timeout))
        if not args.json:
            run = runs[-1]
            print(f"start {i + 1}: ready in {run.ready_s:.2f} s ({run.cpu_s:.1f} CPU s), RSS {run.rss_mib:.0f} MiB "
                  f"(peak {run.peak_rss_mib:.0f}); " + ", ".join(f"{k} {v:.2f}" for k, v in run.phases.items()),
                  flush=True)
    data = {"load_average": os.getloadavg(), "cold": args.cold, "serve_args": serve_args,
            "summary": summarize(runs), "runs": [asdict(r) for r in runs]}
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    s = data["summary"]
    print(f"\nvoxlane serve -> /healthz ready: median {s['ready_s']['median']:.2f} s "
          f"(min {s['ready_s']['min']:.2f}, max {s['ready_s']['max']:.2f}; {len(runs)} starts"
          f"{', model files evicted from the page cache first' if args.cold else ', page cache warm'}); "
          f"CPU {s['cpu_s']['median']:.1f} s; "
          f"RSS once ready {s['rss_mib']['median']:.0f} MiB (peak {s['peak_rss_mib']['median']:.0f} MiB); "
          f"load average {' '.join(f'{x:.2f}' for x in data['load_average'])}")
    for name, value in s["phases_s"].items():
        print(f"  {name:<28} {value['median']:6.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
