"""Build llama.cpp natively, on demand, as the engine benchmark's peer (never a Voxlane dependency).

The source is the ``vendor/llama.cpp`` of the llama-cpp-python sdist on PyPI (the one package
registry this machine reaches), configured with ``-DGGML_NATIVE=ON`` (every instruction set of this
CPU, as a user building it for their own machine would) and static libraries; the tools
``llama-bench`` and ``llama-batched-bench`` are copied to ``~/.cache/voxlane/llama.cpp/<key>/bin``,
where the key hashes the version, the build variant and the CPU's flags. Building takes ~6 minutes
on 2 cores; later calls return the cached tools at once.

**Variants, tried in order** (``VARIANTS``): the first whose ``llama-bench`` passes a smoke run
(``-p 8 -n 1`` on the GGUF about to be measured: prompt processing and decode) is the peer.

1. ``native``: the source as released.
2. ``native, AMX tile config fixed``: on Intel CPUs with AMX-INT8, ``-march=native`` compiles ggml's
   AMX matmul (``ggml-cpu/amx/mmq.cpp``), whose ``ggml_tile_config_init`` fills a 64-byte tile config
   on the stack and passes it to ``_tile_loadconfig``. GCC up to 12's ``amxtileintrin.h`` declares
   that intrinsic's asm as reading ``*(const void **)config``, 8 bytes, so GCC deletes the stores of
   the rows and column widths as dead: ``ldtilecfg`` loads palette 1 with zero or stale rows and
   faults (#GP, SIGSEGV with ``si_code=SI_KERNEL``) on the first prompt of any model (decode, one
   row, takes the AVX512-VNNI path and runs). Seen on the sixth session's Xeon with GCC 12.2 in
   ``gdb``: ``ldtilecfg 0xc0(%rsp)`` right after a 32-byte zeroing and ``movb $1`` (upstream:
   llama.cpp PR #26954, issue #20824). The variant replaces that one call by the same instruction
   with the whole struct as its memory operand (``TILECFG_PATCH``), so the config is written as the
   source says; nothing else changes, the AMX kernels still run.
3. ``native, AMX off``: ``-mno-amx-tile -mno-amx-int8 -mno-amx-bf16`` with ``-march=native`` (GCC
   honours explicit ``-mno-*`` flags whatever their order), so ggml's AVX-512/VNNI paths do prompts.
   For machines where AMX faults for a reason the fix above does not cover.

    python -m bench.llama_cpp_build [--smoke GGUF]   # build (or find) and print the bin directory
"""
from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

VERSION = "0.3.36"  # llama-cpp-python's sdist; its vendor/llama.cpp is what gets built
TOOLS = ("llama-bench", "llama-batched-bench")
CMAKE_FLAGS = ("-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
               "-DCMAKE_BUILD_TYPE=Release")


@dataclass(frozen=True)
class Patch:
    """Replace ``old`` (which must occur exactly once) by ``new`` in ``path`` of the llama.cpp tree."""
    path: str
    old: str
    new: str

    def apply(self, source: Path) -> None:
        file = source / self.path
        text = file.read_text()
        if text.count(self.old) != 1:
            raise RuntimeError(f"{self.path}: expected one {self.old.strip()!r}, found {text.count(self.old)}")
        file.write_text(text.replace(self.old, self.new))


@dataclass(frozen=True)
class Variant:
    name: str
    cmake_flags: tuple[str, ...] = ()  # after CMAKE_FLAGS
    patches: tuple[Patch, ...] = ()

    def key_text(self) -> str:
        """What the cache key hashes besides version and CPU ('' for the plain build: its key is the
        one it always had, so an existing build is found)."""
        parts = [*self.cmake_flags, *(f"patch {p.path}: {p.old} -> {p.new}" for p in self.patches)]
        return "" if not parts else " " + " ".join(parts)


TILECFG_PATCH = Patch(
    "ggml/src/ggml-cpu/amx/mmq.cpp", "    _tile_loadconfig(&tc);\n",
    "    // voxlane: _tile_loadconfig as GCC <= 12 declares it reads 8 bytes of tc, the stores of rows and\n"
    "    // colsb are dropped as dead and ldtilecfg faults; the same instruction, reading all of tc.\n"
    "    __asm__ volatile(\"ldtilecfg %0\" :: \"m\"(tc));\n")
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
VARIANTS = (
    Variant("native"),
    Variant("native, AMX tile config fixed", patches=(TILECFG_PATCH,)),
    Variant("native, AMX off", cmake_flags=(f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}")),
)


def cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cache_dir(variant: Variant = VARIANTS[0]) -> Path:
    key = hashlib.sha256(f"{VERSION} {' '.join(CMAKE_FLAGS)} {cpu_flags()}{variant.key_text()}".encode())
    return Path.home() / ".cache" / "voxlane" / "llama.cpp" / key.hexdigest()[:16]


def built_tools(variant: Variant = VARIANTS[0]) -> Path | None:
    """The bin directory when every tool of ``variant`` is built already, else None."""
    bin_dir = cache_dir(variant) / "bin"
    return bin_dir if all((bin_dir / tool).exists() for tool in TOOLS) else None


def _run(cmd: list[str], log, **kwargs) -> None:
    print("[llama.cpp build] " + " ".join(cmd), file=log, flush=True)
    subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, **kwargs)


def compile_variant(variant: Variant, log=sys.stderr) -> Path:
    """Download, patch, configure and build ``variant`` into its cache directory -> its bin directory."""
    for tool in ("cmake", "ninja"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"building llama.cpp needs {tool} (apt-get install cmake ninja-build)")
    target = cache_dir(variant)
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
        for patch in variant.patches:
            print(f"[llama.cpp build] {variant.name}: patching {patch.path}", file=log, flush=True)
            patch.apply(source)
        _run(["cmake", "-S", str(source), "-B", str(work / "build"), "-G", "Ninja", *CMAKE_FLAGS,
              *variant.cmake_flags], log)
        _run(["cmake", "--build", str(work / "build"), "--target", *TOOLS], log)
        staging = target / "bin.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for tool in TOOLS:
            shutil.copy2(work / "build" / "bin" / tool, staging / tool)
        shutil.rmtree(target / "bin", ignore_errors=True)
        staging.rename(target / "bin")  # all tools appear at once: a half build is never "ready"
    return target / "bin"


def smoke(bin_dir: Path, gguf: Path) -> str | None:
    """Run ``llama-bench -p 8 -n 1`` (a prompt, then a decode step) -> None when it ran, else why not."""
    cmd = [str(bin_dir / "llama-bench"), "-m", str(gguf), "-p", "8", "-n", "1", "-t", "1", "-fa", "1", "-r", "1"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "llama-bench -p 8 -n 1 timed out"
    if done.returncode == 0:
        return None
    how = f"died of signal {-done.returncode}" if done.returncode < 0 else f"exited with {done.returncode}"
    return f"llama-bench -p 8 -n 1 {how}"


_chosen: dict[Path, tuple[Path, Variant]] = {}


def build_peer(log=sys.stderr, smoke_gguf: Path | None = None) -> tuple[Path, Variant]:
    """The first variant (cached, or built now) whose llama-bench runs a prompt on ``smoke_gguf`` ->
    (its bin directory, the variant). Without a GGUF nothing is checked: the first variant is taken.
    Needs pip, cmake, ninja and a C++ compiler when something has to be built."""
    if smoke_gguf in _chosen and built_tools(_chosen[smoke_gguf][1]) == _chosen[smoke_gguf][0]:
        return _chosen[smoke_gguf]  # checked once per process and file (decode_ab asks once per sample)
    failures = []
    for variant in VARIANTS:
        bin_dir = built_tools(variant) or compile_variant(variant, log)
        if smoke_gguf is None:
            return bin_dir, variant
        why = smoke(bin_dir, smoke_gguf)
        if why is None:
            if failures:
                print(f"[llama.cpp build] using '{variant.name}' ({'; '.join(failures)})", file=log, flush=True)
            _chosen[smoke_gguf] = bin_dir, variant
            return bin_dir, variant
        failures.append(f"'{variant.name}': {why}")
        print(f"[llama.cpp build] '{variant.name}' fails its smoke run: {why}", file=log, flush=True)
    raise RuntimeError("no llama.cpp build runs a prompt here: " + "; ".join(failures))


def build(log=sys.stderr, smoke_gguf: Path | None = None) -> Path:
    """The bin directory holding ``TOOLS`` (see ``build_peer``)."""
    return build_peer(log, smoke_gguf)[0]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", type=Path, help="a GGUF file: take the first variant that runs a prompt on it")
    parser.add_argument("--variant", choices=[v.name for v in VARIANTS], help="build (or find) this variant only")
    args = parser.parse_args()
    if args.variant:
        chosen = next(v for v in VARIANTS if v.name == args.variant)
        path = built_tools(chosen) or compile_variant(chosen)
        print(path, smoke(path, args.smoke) if args.smoke else "")
    else:
        path, chosen = build_peer(smoke_gguf=args.smoke)
        print(path, chosen.name)
