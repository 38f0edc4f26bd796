"""The benchmark's GGUF requantizer: the packaged Q4_1 SmolLM2 rewritten as Q8_0 keeps every
metadata field and tensor, and still is the same model: every weight equals the packaged one's up
to Q8_0 rounding."""
from __future__ import annotations

import gguf
import numpy as np
from gguf.quants import dequantize

from app.model_store import smollm2_gguf_path
from bench.gguf_requant import requantize


def test_q8_0_copy_keeps_metadata_and_model(tmp_path):
    source = smollm2_gguf_path()
    copy = requantize(source, tmp_path / "model.Q8_0.gguf", "Q8_0")
    assert not list(tmp_path.glob("*.partial"))
    before, after = gguf.GGUFReader(str(source)), gguf.GGUFReader(str(copy))
    assert [t.name for t in after.tensors] == [t.name for t in before.tensors]
    kinds = {t.tensor_type for t in after.tensors if len(t.shape) == 2}
    assert kinds == {gguf.GGMLQuantizationType.Q8_0}
    assert {k for k in after.fields if not k.startswith("GGUF.")} == {k for k in before.fields if not k.startswith("GGUF.")}
    file_type = after.fields["general.file_type"]
    assert file_type.parts[file_type.data[0]][0] == gguf.LlamaFileType.MOSTLY_Q8_0

    # Q8_0 stores blocks of 32 as int8 times one fp16 scale (block max / 127): each weight moves by
    # at most about half a step, under 1/127 of the tensor's largest weight. A transposed, shuffled
    # or misnamed tensor would be off by the size of the weights themselves.
    for packaged, copied in zip(before.tensors, after.tensors):
        a = dequantize(packaged.data, packaged.tensor_type).astype(np.float32)
        b = dequantize(copied.data, copied.tensor_type).astype(np.float32)
        assert a.shape == b.shape, packaged.name
        assert np.abs(a - b).max() <= np.abs(a).max() / 127, packaged.name
