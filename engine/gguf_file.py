"""A GGUF file, read without loading it: metadata, the tensor table, and each tensor's raw bytes
by memory map (dequantized on request by the ``gguf`` package).

Why our own header reader: ``gguf.GGUFReader`` builds a numpy view per element of every array
field, and a Qwen2 file carries 152k tokens and 151k merges; it took 5-44 s here just to open the
0.5B model. This reads the same header in well under a second and checks that the file is whole
(every tensor's bytes inside it), which is how a joined split file is validated.

Format (GGUF v2/v3, little-endian): magic ``GGUF``, version u32, tensor count u64, kv count u64,
then the key/values, then per tensor: name, n_dims u32, dims u64[n_dims] (fastest first), ggml type
u32, offset u64 (from the data section, which starts at the next multiple of ``general.alignment``).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8",
          12: "<f8"}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """A file that is not a whole, readable GGUF file."""


@dataclass(frozen=True)
class GGUFTensor:
    """Where one tensor's bytes are. ``shape`` is in torch order (rows first)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # absolute, from the start of the file
    nbytes: int

    @property
    def type_name(self) -> str:
        import gguf

        return gguf.GGMLQuantizationType(self.ggml_type).name


class _Cursor:
    """Sequential little-endian reads over the header bytes."""

    def __init__(self, data: bytes | memoryview):
        self.data, self.pos = data, 0

    def scalar(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        text = bytes(self.data[self.pos: self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return text

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind, count = self.scalar("<I"), self.scalar("<Q")
            if item_kind == _STRING:
                return [self.string() for _ in range(count)]
            if item_kind in _NUMPY:  # numbers: one numpy array, not one object per element
                array = np.frombuffer(self.data, dtype=_NUMPY[item_kind], count=count, offset=self.pos)
                self.pos += array.nbytes
                return array.copy()
            return [self.value(item_kind) for _ in range(count)]
        if kind not in _SCALAR:
            raise GGUFError(f"unknown metadata value type {kind}")
        return self.scalar(_SCALAR[kind])


class GGUFFile:
    """One GGUF file: ``metadata`` (key -> value), ``tensors`` (name -> ``GGUFTensor``), raw bytes
    by memory map (``raw``) and fp32 tensors (``dequantize``)."""

    def __init__(self, path: str | Path):
        import gguf

        self.path = Path(path)
        size = self.path.stat().st_size
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        cursor = _Cursor(memoryview(self._map))
        try:
            if bytes(self._map[:4]) != GGUF_MAGIC:
                raise GGUFError(f"{self.path}: not a GGUF file (magic {bytes(self._map[:4])!r})")
            cursor.pos = 4
            self.version = cursor.scalar("<I")
            if self.version not in SUPPORTED_VERSIONS:
                raise GGUFError(f"{self.path}: GGUF version {self.version} (supported: {SUPPORTED_VERSIONS})")
            num_tensors, num_kv = cursor.scalar("<Q"), cursor.scalar("<Q")
            self.metadata: dict[str, object] = {}
            for _ in range(num_kv):
                key = cursor.string()
                self.metadata[key] = cursor.value(cursor.scalar("<I"))
            infos = []
            for _ in range(num_tensors):
                name = cursor.string()
                dims = [cursor.scalar("<Q") for _ in range(cursor.scalar("<I"))]
                infos.append((name, tuple(reversed(dims)), cursor.scalar("<I"), cursor.scalar("<Q")))
        except (struct.error, UnicodeDecodeError, ValueError) as error:
            if isinstance(error, GGUFError):
                raise
            raise GGUFError(f"{self.path}: truncated or corrupt GGUF header ({error})") from error
        alignment = int(self.metadata.get("general.alignment", 32))
        data_start = -(-cursor.pos // alignment) * alignment
        self.tensors: dict[str, GGUFTensor] = {}
        for name, shape, ggml_type, offset in infos:
            try:
                block, type_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
            except (ValueError, KeyError) as error:
                raise GGUFError(f"{self.path}: tensor {name} has unknown ggml type {ggml_type}") from error
            elements = int(np.prod(shape))
            tensor = GGUFTensor(name, shape, ggml_type, data_start + offset, elements // block * type_bytes)
            if tensor.offset + tensor.nbytes > size:
                raise GGUFError(f"{self.path}: truncated: tensor {name} ends at byte {tensor.offset + tensor.nbytes:,}"
                                f" but the file has {size:,}")
            self.tensors[name] = tensor

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def field(self, key: str, default=None):
        """An architecture field: ``field("block_count")`` reads ``<arch>.block_count``."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as stored, uint8 [rows, bytes per row] (a view of the memory map)."""
        t = self.tensors[name]
        rows = int(np.prod(t.shape[:-1])) if len(t.shape) > 1 else 1
        return self._map[t.offset: t.offset + t.nbytes].reshape(rows, t.nbytes // rows)

    def dequantize(self, name: str) -> Tensor:
        """The tensor in float32, in torch order."""
        import gguf
        from gguf.quants import dequantize

        t = self.tensors[name]
        values = dequantize(self.raw(name), gguf.GGMLQuantizationType(t.ggml_type))
        # F32 tensors come back as a read-only view of the map: copy those, so the result is ours.
        values = np.array(values, dtype=np.float32, copy=not values.flags.writeable)
        return torch.from_numpy(values).reshape(t.shape)
