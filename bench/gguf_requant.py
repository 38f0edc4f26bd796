"""Requantize a GGUF file's weight matrices to another GGML type, keeping every metadata field.

For the benchmark's llama.cpp peer: the packaged SmolLM2 is Q4_1 (4.5 bits per weight), while our
engine reads 8-bit weights; llama.cpp on a Q8_0 copy reads the same number of bytes per weight
as we do, which is the comparison the engine's targets are stated in. Each matrix is dequantized
(exactly, by the ``gguf`` package) and quantized again; vectors (norms) stay float32.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np


def requantize(source: Path, destination: Path, kind: str = "Q8_0") -> Path:
    """Write ``destination``: ``source`` with every 2-D weight in ``kind``; returns the path.
    Written to a temporary name and renamed, so an interrupted run leaves no half file."""
    import gguf
    from gguf.quants import dequantize, quantize

    target = gguf.GGMLQuantizationType[kind]
    reader = gguf.GGUFReader(str(source))
    arch_field = reader.fields["general.architecture"]
    writer_path = destination.with_suffix(".partial")
    writer = gguf.GGUFWriter(str(writer_path), bytes(arch_field.parts[arch_field.data[0]]).decode())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # written by the writer itself
        value = _field_value(field)
        if name == "general.file_type":  # says what most weights are: now ``kind``
            value = int(gguf.LlamaFileType[f"MOSTLY_{kind}"])
        writer.add_key_value(name, value, field.types[0], sub_type=field.types[1] if len(field.types) > 1 else None)
    for tensor in reader.tensors:
        weights = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        if weights.ndim == 1:
            writer.add_tensor(tensor.name, weights)
        else:
            packed = quantize(weights, target)
            writer.add_tensor(tensor.name, packed, raw_shape=packed.shape, raw_dtype=target)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    writer_path.rename(destination)
    return destination


def _field_value(field):
    import gguf

    kind = field.types[0]
    if kind == gguf.GGUFValueType.ARRAY:
        if field.types[1] == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if kind == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")
    return field.parts[field.data[0]].tolist()[0]
