"""Build llama.cpp natively, on demand, as the engine benchmark's peer (never a Voxlane dependency).

The source is the ``vendor/llama.cpp`` of the llama-cpp-python sdist on PyPI (the one package
registry this machine reaches), configured with ``-DGGML_NATIVE=ON`` (every instruction set of this
CPU, as a user building it for their own machine would) and static libraries; the tools
``llama-bench`` and ``llama-batched-bench`` are copied to ``~/.cache/voxlane/llama.cpp/<key>/bin``,
where the key hashes the version and the CPU's flags. Building takes ~6 minutes on 2 cores; later
calls return the cached tools at once.

    python -m bench.llama_cpp_build          # build (or find) and print the bin directory
"""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.3.36"  # llama-cpp-python's sdist; its vendor/llama.cpp is what gets built
TOOLS = ("llama-bench", "llama-batched-bench")
CMAKE_FLAGS = ("-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
               "-DCMAKE_BUILD_TYPE=Release")


def cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cache_dir() -> Path:
    key = hashlib.sha256(f"{VERSION} {' '.join(CMAKE_FLAGS)} {cpu_flags()}".encode()).hexdigest()[:16]
    return Path.home() / ".cache" / "voxlane" / "llama.cpp" / key


def built_tools() -> Path | None:
    """The bin directory when every tool is built already, else None."""
    bin_dir = cache_dir() / "bin"
    return bin_dir if all((bin_dir / tool).exists() for tool in TOOLS) else None


def _run(cmd: list[str], log, **kwargs) -> None:
    print("[llama.cpp build] " + " ".join(cmd), file=log, flush=True)
    subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, **kwargs)


def build(log=sys.stderr) -> Path:
    """The bin directory holding ``TOOLS``, built first if needed (needs pip, cmake, ninja, a C++ compiler)."""
    ready = built_tools()
    if ready:
        return ready
    for tool in ("cmake", "ninja"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"building llama.cpp needs {tool} (apt-get install cmake ninja-build)")
    target = cache_dir()
    with tempfile.TemporaryDirectory(prefix="voxlane-llama-cpp-") as tmp:
        work = Path(tmp)
        # --no-binary for this package only: with ":all:" pip also builds every build-time
        # dependency of its metadata step from source (minutes, for nothing that is used).
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python", "-q",
              f"llama-cpp-python=={VERSION}", "-d", str(work)], log)
        (sdist,) = work.glob("llama_cpp_python-*.tar.gz")
        with tarfile.open(sdist) as archive:
            archive.extractall(work, filter="data")
        (source,) = work.glob("llama_cpp_python-*/vendor/llama.cpp")
        _run(["cmake", "-S", str(source), "-B", str(work / "build"), "-G", "Ninja", *CMAKE_FLAGS], log)
        _run(["cmake", "--build", str(work / "build"), "--target", *TOOLS], log)
        staging = target / "bin.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for tool in TOOLS:
            shutil.copy2(work / "build" / "bin" / tool, staging / tool)
        shutil.rmtree(target / "bin", ignore_errors=True)
        staging.rename(target / "bin")  # all tools appear at once: a half build is never "ready"
    return target / "bin"


if __name__ == "__main__":
    print(build())
