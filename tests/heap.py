"""The heap in use, for tests that check memory comes back: glibc's mallinfo2 (bytes malloc'd and
not freed, mmap'd blocks included). Every native library here (torch, oneDNN, ONNX Runtime,
CTranslate2) allocates through malloc, so this sees their growth, and unlike RSS it does not count
what the allocator merely keeps cached."""
from __future__ import annotations

import ctypes
import gc


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap_in_use() -> int:
    """Bytes in use on the heap, after a full collection and malloc_trim."""
    gc.collect()
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc_trim(0)
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd
