"""Reading a user's words as still open: the prompt and the tokens that end-of-turn scoring needs.

The end-of-turn signal from text (pipeline/endpointing/) asks the model how likely the next token
ends the sentence right after what the user has said so far. So the prompt is the chat template
cut right after the last user text (no end-of-turn token, no assistant header), and the answer is
the probability mass on tokens that end a sentence or the turn.
"""
from __future__ import annotations

SENTENCE_ENDS = (".", "?", "!")


def open_user_turn_ids(tokenizer, messages: list[dict]) -> list[int] | None:
    """Token ids of ``messages`` rendered by the chat template and cut right after the last user
    message's text, or None when the template does not contain that text verbatim (or it is empty).

    The cut is made in the rendered text, then tokenized: with byte-level BPE the ids up to the
    user's last word are those of the full prompt, so the answer that follows reuses them."""
    users = [m for m in messages if m.get("role") == "user"]
    text = users[-1].get("content", "") if users else ""
    if not text.strip():
        return None
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    at = rendered.rfind(text)
    if at < 0:
        return None
    return list(tokenizer.encode(rendered[: at + len(text)], add_special_tokens=False))


def sentence_end_token_ids(tokenizer, eos_ids: set[int]) -> frozenset[int]:
    """Ids of tokens whose text starts (after spaces) with ".", "?" or "!" but not an ellipsis,
    plus the end-of-turn ids: the tokens with which a finished sentence may go on."""
    # Decoding all ~50k tokens one by one takes seconds; byte-level BPE and SentencePiece both keep
    # ASCII punctuation as itself in the token strings, so only tokens containing one are decoded.
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    candidates = [i for i, piece in enumerate(pieces) if piece and any(c in piece for c in SENTENCE_ENDS)]
    texts = tokenizer.batch_decode([[i] for i in candidates])
    ends = {i for i, t in zip(candidates, texts) if t.lstrip().startswith(SENTENCE_ENDS) and not t.lstrip().startswith("..")}
    return frozenset(ends | set(eos_ids))
