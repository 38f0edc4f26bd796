"""``voxlane serve`` as a user starts it, in a process of its own: the configured default backend
(our engine), the shipped personas only, port 0 (the server binds a free port and prints it; no
probing for a free port that someone else may take before the server binds it)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
SERVING = re.compile(r"voxlane: serving on (http://\S+)")


class ServeProcess:
    """``with ServeProcess(folder) as served: ... served.url, served.ws_url ...``; the server's
    output goes to ``served.log_path`` (printed when the process ends)."""

    def __init__(self, folder: Path, *args: str, start_timeout_s: float = 600.0):
        self.log_path = folder / "serve.log"
        self.args = args
        self.start_timeout_s = start_timeout_s
        # The user's persona folder: empty unless a test writes a persona there; whatever personas
        # this machine's user has are not used.
        self.personas_dir = folder / "personas"
        self.personas_dir.mkdir(exist_ok=True)
        self.env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1",
                        VOXLANE_PERSONAS_USER_DIR=str(self.personas_dir))
        self.process: subprocess.Popen | None = None
        self.url = ""

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://", 1) + "/ws"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def __enter__(self) -> "ServeProcess":
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "app", "serve", "--port", "0", *self.args],
                                            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        try:
            self._wait_serving()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_serving(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"voxlane serve exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            found = SERVING.search(self.log())
            if found:
                self.url = found.group(1)
                try:
                    if httpx.get(self.url + "/healthz", timeout=5).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass  # printed just before uvicorn starts accepting
            time.sleep(0.2)
        raise TimeoutError(f"voxlane serve not healthy after {self.start_timeout_s} s:\n{self.log()[-3000:]}")

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        print(f"server log: {self.log_path}")
