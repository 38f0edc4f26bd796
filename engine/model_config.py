"""A model directory's config.json read as it is, when it spells out everything the engine reads.

transformers' ``AutoConfig`` fills absent keys with each model class's defaults; importing it costs
~3 CPU seconds of every start (see engine/chat_tokenizer.py). The directories the model store
prepares are written by transformers 5's ``save_pretrained``, which writes every key, so the file
alone is the same config. A file that leaves out a key the engine reads (a hand-trimmed hub
config) is not guessed at: ``engine.loader.load_config`` then asks transformers.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

# Keys read by engine.loader.model_args_from_config, engine.rope and engine.outputs whose class
# default transformers would otherwise supply. (Keys read with getattr and a default of their own,
# such as head_dim, mlp_bias or partial_rotary_factor, match transformers when absent.)
REQUIRED_KEYS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "max_position_embeddings",
                 "tie_word_embeddings", "eos_token_id")
REQUIRED_BY_TYPE = {"llama": ("attention_bias",), "mistral": ("sliding_window",)}


def read_model_config(model_dir: str | Path) -> SimpleNamespace | None:
    """config.json as attributes, or None when it is missing or leaves a needed key to defaults."""
    file = Path(model_dir) / "config.json"
    if not file.is_file():
        return None
    data = json.loads(file.read_text(encoding="utf-8"))
    needed = REQUIRED_KEYS + REQUIRED_BY_TYPE.get(data.get("model_type"), ())
    has_rope = "rope_parameters" in data or "rope_theta" in data
    if not has_rope or any(key not in data for key in needed):
        return None
    return SimpleNamespace(**data)
