"""One session's conversation: what the user said and what they actually heard in reply.

An exchange's assistant text is what the model wrote until playback says otherwise: when the
user interrupts, ``cut`` keeps only the heard part and marks the exchange interrupted. An answer
that begins only after its turn is over (``end_before``) is settled as it begins: a speculative
one the user spoke over leaves nothing (ASR reads its words again with the rest), one of a turn
the user had finished is kept unheard. Prompts keep within a token budget by dropping the oldest
exchanges, never the system prompt.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Callable

from engine.backends.base import Message


@dataclass(frozen=True)
class Exchange:
    """One user turn and the assistant's reply."""

    gen: int
    user: str
    assistant: str = ""  # everything the model wrote
    heard: str | None = None  # set when the reply was cut off: what the user heard of it
    is_interrupted: bool = False
    is_settled: bool = False  # playback finished or was cut: the text is final

    @property
    def reply(self) -> str:
        """The reply as the conversation remembers it."""
        return self.assistant if self.heard is None else self.heard


class History:
    """Thread-safe list of exchanges (the LLM stage writes, playback reports cut)."""

    def __init__(self, keep: int = 200) -> None:
        self._keep = keep  # exchanges remembered; prompts use fewer (max_turns, token budget)
        self._exchanges: dict[int, Exchange] = {}
        self._dropped: set[int] = set()  # a dropped gen stays dropped, even if begin() comes late
        self._over_below = 0  # turns older than this are over (``end_before``)
        self._committed_over: set[int] = set()  # which of them the user had finished (their words count)
        self._lock = threading.Lock()

    def begin(self, gen: int, user: str) -> None:
        """The answer to ``gen`` starts. If its turn is already over (the answer began after the
        user went on or barged in), nothing of it can be heard: a turn the user had finished is kept
        with nothing heard, as a barge-in before its first word would leave it; a speculative one
        leaves no trace."""
        with self._lock:
            if gen in self._dropped:
                pass
            elif gen >= self._over_below:
                self._exchanges[gen] = Exchange(gen, user)
            elif gen in self._committed_over:
                self._exchanges[gen] = Exchange(gen, user, heard="", is_interrupted=True, is_settled=True)
            for old in sorted(self._exchanges)[: max(0, len(self._exchanges) - self._keep)]:
                del self._exchanges[old]

    def finish(self, gen: int, assistant: str) -> None:
        with self._lock:
            if gen in self._exchanges:
                self._exchanges[gen] = replace(self._exchanges[gen], assistant=assistant)

    def drop(self, gen: int) -> None:
        """Forget an exchange that failed, or a speculative one the user spoke over."""
        with self._lock:
            self._exchanges.pop(gen, None)
            self._dropped.add(gen)

    def end_before(self, gen: int, committed: set[int]) -> None:
        """Turns older than ``gen`` are over (an interruption); ``committed``: those the user had
        finished. Applies to answers that begin later (``begin``); exchanges already begun are
        settled, cut or dropped by the caller."""
        with self._lock:
            self._over_below = max(self._over_below, gen)
            self._committed_over = {g for g in committed if g < self._over_below}

    def cut(self, gen: int, heard: str) -> None:
        """The user interrupted ``gen`` after hearing ``heard``."""
        with self._lock:
            if gen in self._exchanges:
                self._exchanges[gen] = replace(self._exchanges[gen], heard=heard.strip(), is_interrupted=True,
                                               is_settled=True)

    def settle(self, gen: int) -> None:
        """Playback of ``gen`` ran to the end: the whole reply was heard."""
        with self._lock:
            if gen in self._exchanges:
                self._exchanges[gen] = replace(self._exchanges[gen], is_settled=True)

    def unsettled(self, before_gen: int) -> list[int]:
        with self._lock:
            return [g for g, e in self._exchanges.items() if g < before_gen and not e.is_settled]

    def exchanges(self) -> list[Exchange]:
        with self._lock:
            return [self._exchanges[g] for g in sorted(self._exchanges)]

    def clear(self) -> None:
        with self._lock:
            self._exchanges.clear()

    def messages(self, system: str, gen: int, user: str, count_tokens: Callable[[list[Message]], int],
                 token_budget: int, max_turns: int) -> list[Message]:
        """The prompt for turn ``gen``: system + as many recent exchanges as fit + the new user text."""
        past = [e for e in self.exchanges() if e.gen < gen][-max_turns:] if max_turns else []
        while True:
            messages = [{"role": "system", "content": system}]
            for exchange in past:
                messages.append({"role": "user", "content": exchange.user})
                if exchange.reply:
                    reply = exchange.reply + ("..." if exchange.is_interrupted else "")
                    messages.append({"role": "assistant", "content": reply})
            messages.append({"role": "user", "content": user})
            if not past or count_tokens(messages) <= token_budget:
                return messages
            past = past[1:]  # the oldest exchange goes first; the system prompt always stays
