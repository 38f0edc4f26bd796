"""Voxlane's fused CPU kernels (``engine/kernels.cpp``): built once per machine, then loaded.

The decode step of a 135M model is dominated by per-op overhead, so ``kernels.cpp`` fuses each
layer's decode work into a few ops (see its header). ``load_kernels()`` compiles it with the
machine's compiler (``torch.utils.cpp_extension``: g++ and ninja, ``-O3 -march=native``) into
``~/.cache/voxlane/kernels/<key>`` the first time (~10 s) and loads the cached library after that.
When it cannot be built (no compiler), it returns None with the reason logged, and the engine runs
its pure-torch path: slower, same results.

Each op has a pure-torch twin below, written for clarity, that the tests compare against.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import platform
import threading
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
SOURCES = [HERE / "kernels.cpp", HERE / "quant_ops.cpp", HERE / "decode_step.cpp", HERE / "sample_rows.cpp"]  # compiled together into one library
HEADERS = [HERE / "gguf_blocks.h", HERE / "quant_matmul.h", HERE / "gemv512.h", HERE / "prefill_gemm.h", HERE / "q8_matmul.h", HERE / "r16_matmul.h", HERE / "r16_tiles.h", HERE / "r16_batch.h", HERE / "kv_element.h", HERE / "decode_ops.h", HERE / "step_pool.h", HERE / "count_dispatch.h"]
# -fopenmp: at::parallel_for's pragmas use torch's OpenMP (and `omp simd` loops vectorize);
# 512-bit vectors: gcc defaults to 256 on recent Intel CPUs even with AVX-512 (no effect without it).
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-mprefer-vector-width=512"]
_lock = threading.Lock()
_state: dict[str, object] = {}


def _cpu_flags() -> str:
    """The CPU's feature flags: ``-march=native`` code is only valid on a CPU that has them."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def build_key() -> str:
    """Names the build: source, flags, torch version and CPU features (a shared home directory
    may be used from several machines)."""
    digest = hashlib.sha256()
    for part in (*(p.read_bytes() for p in SOURCES + HEADERS), " ".join(CFLAGS).encode(), torch.__version__.encode(), _cpu_flags().encode(),
                 platform.machine().encode()):
        digest.update(part)
    return digest.hexdigest()[:16]


def build_dir(key: str | None = None) -> Path:
    root = os.environ.get("VOXLANE_KERNELS_DIR") or Path.home() / ".cache" / "voxlane" / "kernels"
    return Path(root) / (key or build_key())


def library_path() -> Path | None:
    """The shared library ``load_kernels`` loaded (for ctypes: engine/native_step.py's StepCalls), or
    None when the kernels did not load. The path recorded at the load, not one derived again: the key
    hashes the sources as they are now, and a library built from other sources would not match the
    loaded classes."""
    load_kernels()
    return _state.get("library")  # type: ignore[return-value]


def load_kernels():
    """``torch.ops.voxlane`` with the fused kernels, building them first if needed; None (and the
    reason logged once) when they cannot be built here. Thread-safe; builds at most once per process."""
    with _lock:
        if "ops" not in _state:
            _state["ops"], _state["error"], _state["library"] = _build_and_load()
            if _state["error"]:
                log.warning("fused kernels unavailable, using the pure-torch path: %s", _state["error"])
        return _state["ops"]


def int16_fast() -> bool:
    """True when int16 activations run through VNNI here (the kernels built with AVX-512 F/BW/VNNI,
    ``engine/r16_matmul.h``); elsewhere they run its scalar fallback, correct and slower than int8."""
    ops = load_kernels()
    return ops is not None and bool(ops.r16_vnni())


def unavailable_reason() -> str | None:
    """Why ``load_kernels`` returned None (None when they loaded or were not tried)."""
    return _state.get("error")  # type: ignore[return-value]


@contextlib.contextmanager
def _build_guard(directory: Path):
    """One build (or load) of a key at a time across processes, and no wait on a dead build.

    torch's ``cpp_extension`` marks a build in progress with a ``lock`` file in the build directory
    and waits, without limit, until that file is gone; a build killed midway (Ctrl-C in ``./dev
    setup``, a test timeout) leaves it behind, and every later load hung on it. Our own ``flock``
    (released by the OS when its holder dies) serializes the builders instead, so a ``lock`` file
    found while holding it is a dead build's, and is removed."""
    with open(directory.parent / f"{directory.name}.build-lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            (directory / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(guard, fcntl.LOCK_UN)


def _build_and_load():
    from torch.utils import cpp_extension

    key = build_key()
    directory, name = build_dir(key), f"voxlane_kernels_{key}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with _build_guard(directory):
            cpp_extension.load(name=name, sources=[str(p) for p in SOURCES], extra_cflags=CFLAGS,
                               build_directory=str(directory), is_python_module=False, verbose=False)
        return torch.ops.voxlane, None, directory / f"{name}.so"
    except Exception as error:  # a missing compiler or ninja, a failed build: fall back, say why
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return None, f"{type(error).__name__}: {first_line}", None


# ---- the pure-torch twins (reference semantics of each kernel) ----
def int8_linear_reference(x: Tensor, w: Tensor, scale: Tensor, bias: Tensor | None) -> Tensor:
    """x [M, K] fp32, w [N, K] int8, scale [N] fp32 -> [M, N] fp32."""
    y = F.linear(x, w.to(x.dtype)) * scale
    return y + bias if bias is not None else y


def add_rms_norm_reference(residual: Tensor, x: Tensor | None, weight: Tensor, eps: float) -> Tensor:
    """residual += x (in place); returns rms-normed residual times weight."""
    if x is not None:
        residual += x
    return residual * torch.rsqrt(residual.pow(2).mean(-1, keepdim=True) + eps) * weight


def silu_mul_reference(gate_up: Tensor) -> Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def decode_attention_reference(qkv: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
                               slots: Tensor, positions: Tensor, num_heads: int, num_kv_heads: int,
                               window: int = 0, write: bool = True) -> Tensor:
    """qkv [B, (H+2Hkv)*d]; cos, sin [B, d]; caches [S, Hkv, L, d] (written at each slot/position, rounded
    to the caches' dtype: fp32 or fp16; write=False: they already hold the new k/v, attended as they are);
    -> attention output [B, H*d] of each sequence over its own keys 0..position (the last ``window`` of
    them when window > 0), read back in qkv's dtype."""
    from engine.model import apply_rope

    B = qkv.shape[0]
    H, Hkv = num_heads, num_kv_heads
    d = k_cache.shape[-1]
    heads = qkv.view(B, 1, H + 2 * Hkv, d)
    qk = apply_rope(heads[:, :, : H + Hkv], cos[:, None, None], sin[:, None, None])[:, 0]  # [B, H+Hkv, d]
    out = []
    for b in range(B):
        slot, pos = int(slots[b]), int(positions[b])
        if write:
            k_cache[slot, :, pos] = qk[b, H:]
            v_cache[slot, :, pos] = heads[b, 0, H + Hkv:]
        first = max(0, pos + 1 - window) if window > 0 else 0
        keys = k_cache[slot, :, first: pos + 1].to(qkv.dtype).repeat_interleave(H // Hkv, dim=0)  # [H, n, d]
        values = v_cache[slot, :, first: pos + 1].to(qkv.dtype).repeat_interleave(H // Hkv, dim=0)
        out.append(F.scaled_dot_product_attention(qk[b, :H, None], keys, values)[:, 0].reshape(H * d))
    return torch.stack(out)


if __name__ == "__main__":  # ``python -m engine.kernels``: build now (./dev setup does), say where or why not
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    print(f"fused kernels: {build_dir()}" if load_kernels() is not None else "fused kernels: not built")
