"""Model provisioning: packaged models resolve to files that really load; hub names fail clearly offline."""
from __future__ import annotations

import json

import pytest

from app import model_store


def test_every_packaged_model_resolves_to_existing_files():
    for name, model in model_store.PACKAGED.items():
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
