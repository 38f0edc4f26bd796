"""``EngineBackend``: our engine behind the ``LLMBackend`` protocol the voice pipeline consumes."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from engine.backends.base import Message
from engine.config import EngineConfig
from engine.engine import EngineStats, LLMEngine
from engine.sampling_params import SamplingParams
from engine.stream import TokenStream


class EngineBackend:
    """The default LLM backend: ``LLMEngine`` on a local model directory, running on its own thread.

    ``session`` (e.g. the conversation id) keeps the conversation's KV-cache slot between turns, so
    a new turn prefills only the tokens after the longest common prefix with the previous turn.
    """

    name = "engine"

    def __init__(self, model_dir: str | Path, config: EngineConfig | None = None):
        self.config = config or EngineConfig()
        self.engine = LLMEngine(model_dir, self.config, background=True)

    def generate(self, messages: list[Message], sampling: SamplingParams, session: str | None = None) -> TokenStream:
        """The engine's stream is the completion: iterate (or ``async for``) for text deltas;
        ``cancel()`` from any thread ends it at the next step and frees its slot (a session keeps
        what was cached)."""
        return self.engine.submit(messages, sampling, session=session)

    def generate_held(self, messages: list[Message], sampling: SamplingParams, session: str | None,
                      hold_after: int) -> TokenStream:
        """``generate`` that stops after ``hold_after`` tokens until ``stream.release()`` (keeping
        its slot, costing no step meanwhile): an answer started before the user has stopped writes
        its first words, then leaves the cores to ASR until it is known to be wanted."""
        return self.engine.submit(messages, sampling, session=session, hold_after=hold_after)

    def prefill(self, messages: list[Message], session: str | None = None,
                probe_ids: frozenset[int] | None = None) -> float | None:
        """Prefill ``messages`` read as an open user turn (the chat template cut right after the last
        user text, engine/open_turn.py) into ``session``'s slot, which keeps it: the answer submitted
        next (the same text, then punctuation and the assistant header) prefills only the rest.
        One prefill, no sampling; blocks until the engine ran it. Returns P(next token in
        ``probe_ids``) when given, else None (also None when the template hides the text)."""
        ids = self.engine.encode_open_user_turn(messages)
        if ids is None or len(ids) >= self.engine.max_seq_len:
            return None
        stream = self.engine.submit(ids, session=session, probe_ids=probe_ids if probe_ids is not None else frozenset())
        for _ in stream:  # a probe yields no text; this waits for its end
            pass
        return stream.probe if probe_ids is not None else None

    def probe_sentence_end(self, messages: list[Message], session: str | None = None) -> float | None:
        """P(the next token ends a sentence or the turn) right after the last user message's text:
        the end-of-turn text signal (pipeline/endpointing/). A ``prefill`` with the sentence-end ids."""
        return self.prefill(messages, session, self.engine.sentence_end_ids())

    def generate_probing(self, messages: list[Message], sampling: SamplingParams, session: str | None,
                         words: list[Message], on_probe: Callable[[float | None], None]) -> TokenStream | None:
        """``generate``, whose prefill also reads ``probe_sentence_end(words)``: ``words`` (the same
        conversation, the last user text without its final punctuation) must be read as an open user
        turn at the head of ``messages``' prompt. One request instead of a probe and then the answer
        (each pays the engine's admission window and a step). ``on_probe(p)`` is called on the
        engine thread before the first token. None (nothing submitted) when the words' tokens are
        not the head of the prompt's (the caller probes and answers in two requests)."""
        ids, head = self.engine.encode(messages), self.engine.encode_open_user_turn(words)
        if head is None or not 0 < len(head) < len(ids) or ids[:len(head)] != head:
            return None
        return self.engine.submit(ids, sampling, session, probe_ids=self.engine.sentence_end_ids(),
                                  probe_at=len(head), on_probe=on_probe)

    def share_system_prompt(self, system_prompt: str, timeout_s: float = 30.0) -> None:
        """Prefill the chat template's start with this system prompt once, for every session that
        uses it (a read-only shared prefix in the KV cache: see ``LLMEngine.share_prefix``); waits
        until it is ready. Sessions then start their first turn from a copy of it."""
        self.engine.share_prefix(self.engine.system_prefix_ids(system_prompt)).wait(timeout_s)

    def count_tokens(self, messages: list[Message]) -> int:
        return len(self.engine.encode(messages))

    @property
    def context_length(self) -> int:
        return self.engine.max_seq_len

    def end_session(self, session: str) -> None:
        """The conversation is over: its slot may go to someone else now."""
        self.engine.drop_session(session)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def close(self) -> None:
        self.engine.close()
