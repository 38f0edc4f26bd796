"""ChatTokenizer and read_model_config against transformers on the packaged models: the same ids,
text, template and model arguments; and the engine starts without importing transformers."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.chat_tokenizer import ChatTokenizer
from engine.loader import chat_prompt_ids, load_tokenizer, model_args_from_config
from engine.model_config import read_model_config
from engine.rope import rope_parameters

TEXTS = ["Hello there!", "  leading spaces and\ttabs\n\nnew lines ", "Café déjà vu — naïve 東京 🚀🎉 voilà! 𝄞 end.",
         "What is 12 x 7? It's 84.", "<|im_end|> written by a user", ""]
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],  # SmolLM2's template adds its own system
    [{"role": "system", "content": "You are Nova. Answer briefly."}, {"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a joke."},
     {"role": "assistant", "content": "Why did the chicken cross the road?"},
     {"role": "user", "content": "Why? 🐔 Naïve question…"}],
]


@pytest.fixture(scope="module", params=["smollm2", "qwen05"])
def model_dir(request):
    return request.getfixturevalue(f"{request.param}_dir")


@pytest.fixture(scope="module")
def pair(model_dir):
    from transformers import AutoTokenizer

    return ChatTokenizer(model_dir), AutoTokenizer.from_pretrained(model_dir)


def _ids(encoding) -> list[int]:
    return list(encoding["input_ids"] if hasattr(encoding, "keys") else encoding)


def test_chat_template_renders_and_encodes_like_transformers(pair, model_dir):
    ours, theirs = pair
    assert isinstance(load_tokenizer(model_dir), ChatTokenizer)  # what the engine gets
    for messages in CONVERSATIONS:
        for generation_prompt in (True, False):
            text = ours.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)
            assert text == theirs.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)
            assert ours.apply_chat_template(messages, add_generation_prompt=generation_prompt) == \
                _ids(theirs.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True))
        assert chat_prompt_ids(ours, messages) == chat_prompt_ids(theirs, messages)


def test_text_ids_and_special_tokens_like_transformers(pair):
    ours, theirs = pair
    for text in TEXTS:
        ids = ours.encode(text, add_special_tokens=False)
        assert ids == theirs.encode(text, add_special_tokens=False)
        assert ours.decode(ids) == theirs.decode(ids, clean_up_tokenization_spaces=False) == text
    special = ours.apply_chat_template(CONVERSATIONS[1], add_generation_prompt=True)
    assert ours.decode(special, skip_special_tokens=True) == \
        theirs.decode(special, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    assert len(ours) == len(theirs)
    assert (ours.eos_token_id, ours.unk_token_id) == (theirs.eos_token_id, theirs.unk_token_id)
    sample = list(range(0, len(ours), 97))
    assert ours.convert_ids_to_tokens(sample) == theirs.convert_ids_to_tokens(sample)
    assert ours.batch_decode([[i] for i in sample]) == theirs.batch_decode([[i] for i in sample])
    for token in ("<|im_end|>", "<|im_start|>", "no-such-token-anywhere"):
        assert ours.convert_tokens_to_ids(token) == theirs.convert_tokens_to_ids(token)


def test_config_file_gives_the_model_arguments_transformers_gives(model_dir):
    from transformers import AutoConfig

    ours, theirs = read_model_config(model_dir), AutoConfig.from_pretrained(model_dir)
    assert ours is not None
    assert model_args_from_config(ours) == model_args_from_config(theirs)
    assert rope_parameters(ours) == rope_parameters(theirs)
    assert ours.eos_token_id == theirs.eos_token_id


def test_a_config_that_leaves_keys_to_defaults_goes_to_transformers(smollm2_dir, tmp_path):
    data = json.loads((smollm2_dir / "config.json").read_text())
    del data["tie_word_embeddings"]  # LlamaConfig's default would decide it: not guessed here
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert read_model_config(tmp_path) is None
    assert read_model_config(tmp_path / "missing") is None


def test_the_engine_starts_without_importing_transformers(smollm2_dir):
    """The point of both: a cold start does not pay ~3 CPU seconds for transformers' imports."""
    code = ("import sys\nfrom engine.config import EngineConfig\nfrom engine.engine import LLMEngine\n"
            f"engine = LLMEngine({str(smollm2_dir)!r}, EngineConfig(), background=False)\n"
            "ids = engine.encode([{'role': 'user', 'content': 'Hi'}])\n"
            "print(len(ids), sorted(m for m in sys.modules if m.split('.')[0] == 'transformers')[:3])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True).stdout
    count, imported = out.split(" ", 1)
    assert int(count) > 5 and imported.strip() == "[]", out
