"""A model directory's tokenizer and chat template, read without transformers.

Why: importing transformers and resolving ``AutoTokenizer``/``AutoConfig`` costs ~3-4 CPU seconds
of every start (it pulls torch.distributed and sympy), while the engine needs only a fast BPE
(``tokenizers``, the library transformers itself wraps) and the chat template (a Jinja string).
A directory with ``tokenizer.json`` gets this class; anything else (a SentencePiece-only hub
model, a bare .gguf file) still goes through transformers (``engine.loader.load_tokenizer``).

The template is rendered the way transformers 5 renders it (``render_jinja_template``): a sandboxed
Jinja environment with ``trim_blocks``/``lstrip_blocks``, loop controls, ``raise_exception``,
a ``tojson`` that does not escape HTML, and the special tokens as variables; the rendered text is
then encoded without adding special tokens. tests/engine/test_chat_tokenizer.py holds the two to
the same ids and text on the packaged models.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _chat_template(directory: Path, config: dict) -> str | None:
    """transformers 5 writes the template to chat_template.jinja; older saves keep it in the config
    (a string, or a list of named templates of which "default" is the chat one)."""
    file = directory / "chat_template.jinja"
    if file.is_file():
        return file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _compile(template: str):
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


class ChatTokenizer:
    """The subset of a transformers tokenizer the engine and its tools use, on ``tokenizers``.

    ``encode``/``decode``/``batch_decode``/``apply_chat_template``/``convert_*``/``len()`` and the
    special token ids, with transformers' signatures and results (``apply_chat_template`` with
    ``tokenize=True`` returns a plain list of ids)."""

    def __init__(self, directory: str | Path):
        from tokenizers import Tokenizer

        directory = Path(directory)
        self.backend = Tokenizer.from_file(str(directory / "tokenizer.json"))
        config_file = directory / "tokenizer_config.json"
        config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
        self.special_tokens = {key: text for key in SPECIAL_TOKEN_KEYS if (text := _token_text(config.get(key)))}
        self.chat_template = _chat_template(directory, config)
        self._template = _compile(self.chat_template) if self.chat_template else None

    # ---- special tokens ----
    def _id_of(self, key: str) -> int | None:
        text = self.special_tokens.get(key)
        return self.backend.token_to_id(text) if text is not None else None

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens.get("eos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._id_of("eos_token")

    @property
    def unk_token_id(self) -> int | None:
        return self._id_of("unk_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._id_of("pad_token")

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def convert_tokens_to_ids(self, tokens):
        """A token's id (the unknown token's id if it has none), or a list of them."""
        if isinstance(tokens, str):
            token_id = self.backend.token_to_id(tokens)
            return token_id if token_id is not None else self.unk_token_id
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids):
        if isinstance(ids, int):
            return self.backend.id_to_token(ids)
        return [self.backend.id_to_token(i) for i in ids]

    # ---- text <-> ids ----
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool = False) -> str:
        # (The packaged tokenizers set no clean-up; a caller asking for it gets a clear error, not a
        # silently different text.)
        if clean_up_tokenization_spaces:
            raise NotImplementedError("clean_up_tokenization_spaces is not supported by ChatTokenizer")
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def batch_decode(self, sequences, skip_special_tokens: bool = False) -> list[str]:
        return self.backend.decode_batch([list(s) for s in sequences], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = False,
                            tokenize: bool = True, **kwargs):
        """The conversation rendered by the model's template; its ids when ``tokenize``."""
        if self._template is None:
            raise ValueError("this tokenizer has no chat template")
        variables = {**self.special_tokens, **kwargs}
        rendered = self._template.render(messages=[dict(m) for m in messages], tools=None, documents=None,
                                         add_generation_prompt=add_generation_prompt, **variables)
        return self.encode(rendered, add_special_tokens=False) if tokenize else rendered
