"""Token ids -> text deltas that are always whole UTF-8 characters.

Byte-level BPE splits a multi-byte character (an emoji, an accented letter in some vocabularies)
over several tokens; decoding a prefix of them gives U+FFFD. So a delta is only released once the
text decodes cleanly, and it is computed by decoding a small window and diffing against the
window's previous text (vLLM's prefix/read offsets), which also keeps SentencePiece's leading-space
handling right and the cost per token constant.
"""
from __future__ import annotations

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Feed output token ids one at a time with ``add``; get the text each one completes."""

    def __init__(self, tokenizer, context_ids: list[int] | None = None):
        self.tokenizer = tokenizer
        # A few prompt ids as left context so the first output token decodes as it would in place.
        self.ids: list[int] = list(context_ids or [])[-4:]
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset: self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        if len(full) <= len(prefix) or full.endswith(REPLACEMENT):
            return ""  # nothing new yet, or an incomplete character: wait for the next token
        delta = full[len(prefix):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return delta
