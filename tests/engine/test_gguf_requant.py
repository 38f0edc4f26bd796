"""The benchmark's GGUF requantizer: the packaged Q4_1 SmolLM2 rewritten as Q8_0 keeps every
metadata field and tensor, and still is the same model (loaded by transformers' GGUF reader)."""
from __future__ import annotations

import gguf
import torch

from app.model_store import smollm2_gguf_path
from engine.gguf_requant import requantize
from engine.loader import load_model, load_tokenizer


def test_q8_0_copy_keeps_metadata_and_model(tmp_path, smollm2_dir):
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

    ids = load_tokenizer(copy).encode("The lighthouse keeper climbed the stairs and lit the lamp.")
    tokens, positions = torch.tensor([ids]), torch.arange(len(ids))[None]
    q8, reference = load_model(copy, torch.float32, 128), load_model(smollm2_dir, torch.float32, 128)
    with torch.inference_mode():
        a, b = q8.logits(q8(tokens, positions))[0], reference.logits(reference(tokens, positions))[0]
    kl = (b.log_softmax(-1).exp() * (b.log_softmax(-1) - a.log_softmax(-1))).sum(-1).mean().item()
    agreement = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    print(f"Q8_0 copy vs packaged: mean KL {kl:.4f}, top-1 agreement {agreement:.3f} over {len(ids)} positions")
    assert kl < 0.05 and agreement >= 0.8  # Q8_0 rounding of the same weights: close, not identical
