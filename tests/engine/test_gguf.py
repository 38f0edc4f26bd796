"""GGUF files: the header reader, dequantized weights under HF names, and the int8 checkpoint made
from them (the engine's cold-start format), on the packaged SmolLM2 GGUF (Llama architecture)."""
from __future__ import annotations

import shutil

import pytest
import torch

from app.model_store import smollm2_gguf_path
from engine.gguf_file import GGUFError, GGUFFile
from engine.gguf_weights import GGUFWeights, load_gguf_config
from engine.int8_checkpoint import FILE_NAME, has_int8_checkpoint, write_int8_checkpoint
from engine.loader import load_int8_model, load_model, model_args_from_config, read_hf_weights
from engine.quant import int8_state, quantize_int8


@pytest.fixture(scope="module")
def smollm2_gguf() -> GGUFFile:
    return GGUFFile(smollm2_gguf_path())


def test_header_reads_the_metadata_and_tensor_table(smollm2_gguf):
    assert smollm2_gguf.version == 3 and smollm2_gguf.architecture == "llama"
    assert smollm2_gguf.field("block_count") == 30
    assert len(smollm2_gguf.metadata["tokenizer.ggml.tokens"]) == 49152
    assert smollm2_gguf.tensors["blk.0.attn_q.weight"].shape == (576, 576)
    assert smollm2_gguf.tensors["blk.0.attn_q.weight"].type_name == "Q4_1"
    assert "output.weight" not in smollm2_gguf.tensors  # tied embeddings
    config = load_gguf_config(smollm2_gguf)
    assert (config.model_type, config.num_key_value_heads, config.tie_word_embeddings) == ("llama", 3, True)


def test_a_truncated_or_foreign_file_is_refused(tmp_path):
    source = smollm2_gguf_path()
    truncated = tmp_path / "cut.gguf"
    with open(source, "rb") as f:
        truncated.write_bytes(f.read(source.stat().st_size - 1000))
    with pytest.raises(GGUFError, match="truncated"):
        GGUFFile(truncated)
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(source.read_bytes()[:5000])  # cut inside the metadata
    with pytest.raises(GGUFError, match="truncated or corrupt"):
        GGUFFile(header_only)
    foreign = tmp_path / "foreign.gguf"
    foreign.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(GGUFError, match="not a GGUF file"):
        GGUFFile(foreign)


def test_dequantized_weights_equal_transformers_conversion(smollm2_gguf, smollm2_dir):
    # The model store's SmolLM2 directory was dequantized by transformers' own GGUF loader; ours must
    # give the same tensors, including the q/k rows llama.cpp permuted.
    from safetensors.torch import load_file

    reference = load_file(str(smollm2_dir / "model.safetensors"))
    ours = GGUFWeights(smollm2_gguf)
    assert set(ours) == set(reference)
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.7.self_attn.k_proj.weight",
                 "model.layers.3.mlp.down_proj.weight", "model.embed_tokens.weight", "model.norm.weight"):
        assert torch.equal(ours[name], reference[name]), name


def test_int8_checkpoint_equals_quantizing_the_loaded_model_and_loads_the_same(smollm2_gguf, smollm2_dir,
                                                                              tmp_path):
    # From the fp32 safetensors (equal to the GGUF's dequantized tensors, tested above): no second
    # dequantization of the GGUF.
    args = model_args_from_config(load_gguf_config(smollm2_gguf))
    path = write_int8_checkpoint(read_hf_weights(smollm2_dir), args, tmp_path / FILE_NAME)
    from safetensors.torch import load_file

    written = load_file(str(path))
    quantized = quantize_int8(load_model(smollm2_dir))
    expected = int8_state(quantized)
    assert set(written) == set(expected)
    assert all(torch.equal(written[k], expected[k]) for k in expected)
    assert not list(tmp_path.glob("*.partial"))

    # A directory with config, GGUF and checkpoint loads int8 from the checkpoint alone.
    load_gguf_config(smollm2_gguf).save_pretrained(tmp_path)
    shutil.copyfile(smollm2_gguf.path, tmp_path / "model.gguf")
    assert has_int8_checkpoint(tmp_path)
    loaded = load_int8_model(tmp_path, torch.float32, 256)
    tokens, positions = torch.tensor([[1, 504, 3458, 282, 2]]), torch.arange(5)[None]
    with torch.inference_mode():
        a = quantized.logits(quantized(tokens, positions))
        b = loaded.logits(loaded(tokens, positions))
    assert torch.equal(a, b)


def test_a_checkpoint_of_another_format_is_ignored(tmp_path):
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, str(tmp_path / FILE_NAME), metadata={"format": "someone-else/9"})
    assert not has_int8_checkpoint(tmp_path)
