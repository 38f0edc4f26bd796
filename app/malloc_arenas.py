"""Caps glibc's malloc arenas in a long-running server, so its memory stays flat.

glibc gives threads up to eight arenas per core. A server's sessions start and end threads all
the time (four pipeline stages and a pump each), and every arena keeps its own fragmented free
memory, so resident memory creeps up over many rounds of sessions even with nothing leaking.
Measured here (8 sessions x 5 spoken turns a round, whisper-tiny.en, trimmed RSS): after the
first round, +78, +75, +51, +36 MiB a round with glibc's default; +10, +2, +3, +2, +3 MiB with two
arenas, and ~40% less memory in all (docs/operations.md). This does what ``MALLOC_ARENA_MAX=2``
does, from inside the process, as long as it runs before the threads start.
"""
from __future__ import annotations

import ctypes
import os

M_ARENA_MAX = -8  # mallopt parameter number, from glibc's malloc.h


def limit_malloc_arenas(max_arenas: int = 2) -> bool:
    """Applies the cap; False where it does not apply (not glibc), or when the user already set
    ``MALLOC_ARENA_MAX`` (theirs wins)."""
    if max_arenas < 1:
        raise ValueError(f"max_arenas must be at least 1, got {max_arenas}")
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl, macOS, Windows: their allocators do not work this way
        return False
    return mallopt(M_ARENA_MAX, max_arenas) == 1
