"""LLM stage: a final transcript (or typed text) in, the answer out as text deltas and speakable
chunks. The persona is read at the start of every turn, so edits apply at the next turn.

In "semantic" endpointing the end-of-turn text signal is the engine's probability that the words
end a sentence (``probe_sentence_end``: one prefill into the session's slot, no sampling). Each
partial transcript's speculative prefill is that probe, so when the final transcript has the last
partial's words (ASR reads them at the first silent frame, before the pause) the signal is already
known and the answer is submitted at once. Otherwise, with a backend that can
(``generate_probing``: our engine), the answer's own prefill reads the probe at the words' end:
one engine request, not a probe and then the answer in series (each paid the engine's admission
window and a step). Since ASR's final at the pause reuses the read taken at the first silent frame,
that read's partial is not probed on its own: the answer that follows at once probes its words.
Other backends probe the final first, in series. Either way the answer reuses the prefill.

When a partial's words already read as a finished sentence (their probe at least
``early_answer_min_p``), the answer is submitted then, while the user may still be speaking
(``EarlyAnswer``); the final adopts it when it says exactly those words, so the model's first
words are ready when the user stops. A partial with other words cancels it."""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable

from engine.backends.base import Completion, LLMBackend
from engine.sampling_params import SamplingParams
from pipeline.config import ChunkerConfig, LLMStageConfig
from pipeline.endpointing.decision import strip_trailing_punctuation
from pipeline.endpointing.endpointer import Endpointer
from pipeline.frames import (AssistantDone, ErrorFrame, Frame, Interrupt, SpeakChunk, SystemFrame,
                             TextDelta, TextIn, Transcript)
from pipeline.llm.chunker import SpeakableChunker
from pipeline.llm.early_answer import EarlyAnswer
from pipeline.llm.history import History
from pipeline.persona.persona import Persona
from pipeline.stage import Stage, TurnRefused
from pipeline.waterfall import WaterfallBook

log = logging.getLogger(__name__)


class LLMStage(Stage):
    """Prompts the backend with persona + history + the new user text and streams its answer."""

    name = "llm"

    def __init__(self, backend: LLMBackend, persona: Callable[[], Persona], history: History,
                 config: LLMStageConfig, chunker: ChunkerConfig, book: WaterfallBook,
                 session: str | None = None, queue_size: int = 2000, endpointer: Endpointer | None = None,
                 is_spoken: bool = False):
        super().__init__(queue_size)
        self.endpointer = endpointer
        # A TTS stage speaks the chunks and calls SpeakChunk.on_synthesized: only then may the answer
        # wait for it (config.is_first_audio_first); a reader of the bare stage would wait forever.
        self.is_spoken = is_spoken
        self.backend = backend
        self.persona = persona
        self.history = history
        self.config = config
        self.chunker_config = chunker
        self.book = book
        self.session = session
        self._active: tuple[int, Completion] | None = None
        self._shared_prompt: str | None = None  # the system prompt last given to the backend to share
        self._probed: tuple[int, str, float | None] | None = None  # (gen, words, P(sentence end)) of the last partial
        self._early: EarlyAnswer | None = None  # an answer started at a partial (under _lock)
        self._lock = threading.Lock()

    def setup(self) -> None:
        """Prefills the persona's system prompt while the user is still speaking their first words.
        A backend with shared prefixes (our engine) computes it once for every session that uses
        it; otherwise a backend that keeps a session's KV cache prefills it into this session."""
        if not self.config.is_prewarm_enabled:
            return
        try:
            self._share_system_prompt(self.persona())
            if self._shared_prompt is not None or not self.session:
                return
            messages = [{"role": "system", "content": self.persona().full_system_prompt()},
                        {"role": "user", "content": ""}]
            completion = self.backend.generate(messages, SamplingParams(temperature=0.0, max_tokens=1), self.session)
            with self._lock:  # the first turn's Interrupt cancels it: a busy engine must not hold that turn up
                self._active = (0, completion)
            for _ in completion:
                pass
        except Exception:  # only an optimization: the first turn will say what is wrong
            log.warning("prewarming the LLM session failed", exc_info=True)
        finally:
            with self._lock:
                self._active = None

    def _share_system_prompt(self, persona: Persona) -> None:
        """Ask the backend (if it can) to keep this persona's system prompt as a shared prefix; again
        only when the persona's prompt changed (a switch or an edit)."""
        share = getattr(self.backend, "share_system_prompt", None)
        prompt = persona.full_system_prompt()
        if share is not None and prompt != self._shared_prompt:
            share(prompt)
            self._shared_prompt = prompt

    def on_system(self, frame: SystemFrame) -> None:
        # Cancel at once, from the interrupting thread: the backend frees its slot at the next token.
        if isinstance(frame, Interrupt):
            with self._lock:
                if self._active is not None and self._active[0] < frame.gen:
                    self._active[1].cancel()
                if self._early is not None and self._early.gen < frame.gen:
                    self._early.completion.cancel()
                    self._early = None

    def process(self, frame: Frame) -> Iterable[Frame]:
        if isinstance(frame, Transcript) and not frame.is_final:
            yield frame  # shown at once; then its words go into the KV cache while the user speaks on
            if self._early_answer_to(frame.gen, frame.text) is not None:
                return  # the same words again: their answer is already being written
            if not (frame.is_at_silence and self._answer_probes(self.persona())):
                self._prefill_partial(frame.gen, frame.text)  # (the final's answer comes next and probes)
                if not frame.is_at_silence:
                    self._start_early_answer(frame.gen, frame.text)
        elif isinstance(frame, Transcript) and frame.is_final:
            yield frame
            self._early_answer_to(frame.gen, frame.text)  # one to other words is cancelled before any probe
            words = self._probe_end_of_turn(frame.gen, frame.text, frame.avg_logprob)
            yield from self._answer(frame.gen, frame.text, words, frame.avg_logprob)
        elif isinstance(frame, TextIn):
            self._early_answer_to(frame.gen, None)  # (cancels one, if any)
            self.book.mark(frame.gen, "text_in")
            yield Transcript(gen=frame.gen, text=frame.text, is_final=True)
            yield from self._answer(frame.gen, frame.text)
        elif isinstance(frame, ErrorFrame):
            self.history.drop(frame.gen)
            yield frame
        else:
            yield frame

    def _prefill_partial(self, gen: int, text: str) -> None:
        """Speculative prefill: the prompt the answer would have if the user stopped now, cut right
        after their words, goes into the session's KV slot (``backend.prefill``). The final
        transcript's prompt shares all of it up to the first changed word, so at the end of the turn
        only the last words and the assistant header are prefilled. Only an optimization: a backend
        without ``prefill`` (or without a session) skips it, and a failure is logged, not raised."""
        prefill = getattr(self.backend, "prefill", None)
        if prefill is None or not self.session or not self.config.is_partial_prefill_enabled:
            return
        if not text.strip() or self.is_stale(gen):
            return
        try:
            persona = self.persona()
            if self._probes_words(persona):  # the same prefill, read for the end-of-turn signal too
                words = strip_trailing_punctuation(text)
                if words:
                    p_text = self.backend.probe_sentence_end(self._prompt(gen, persona, words)[0], self.session)
                    self._probed = (gen, words, p_text)
                return
            prefill(self._prompt(gen, persona, text)[0], self.session)
        except Exception:
            log.warning("prefilling a partial transcript failed", exc_info=True)

    def _early_answer_to(self, gen: int, text: str | None, take: bool = False) -> EarlyAnswer | None:
        """The early answer being written to these words of turn ``gen`` (``take``: it is this
        turn's request now, no longer the stage's to cancel). One to other words (or any, for
        ``text`` None) is cancelled, before whatever the caller submits next: the session's slot is
        then free for it."""
        with self._lock:
            early = self._early
            if early is not None and (early.gen, early.text) != (gen, text):
                early.completion.cancel()
                early = self._early = None
            if take:
                self._early = None
            return early

    def _start_early_answer(self, gen: int, text: str) -> None:
        """Submit the answer to this partial now when its words, just probed, read as a finished
        sentence (see ``EarlyAnswer``). Only an optimization: a failure is logged, not raised."""
        probed, persona = self._probed, self.persona()
        if not self.config.is_early_answer_enabled or not self.session or self.is_stale(gen) or probed is None \
                or probed[:2] != (gen, strip_trailing_punctuation(text)) or probed[2] is None \
                or probed[2] < self.config.early_answer_min_p:
            return
        try:
            messages = self._prompt(gen, persona, text)[0]
            held = getattr(self.backend, "generate_held", None)  # our engine: the first words, then it waits
            completion = held(messages, persona.sampling, self.session, self.config.early_answer_tokens) \
                if held is not None and self.config.early_answer_tokens else \
                self.backend.generate(messages, persona.sampling, self.session)
        except Exception:
            log.warning("starting an early answer failed", exc_info=True)
            return
        with self._lock:
            if self.is_stale(gen):  # interrupted meanwhile: on_system did not see this request
                completion.cancel()
                return
            self._early = EarlyAnswer(gen, text, messages, persona.sampling, completion)
        self.book.add(gen, "early_answers", 1)

    def _adopt_early_answer(self, gen: int, text: str, messages: list[dict],
                            sampling: SamplingParams) -> Completion | None:
        """The early answer if it is exactly this turn's answer (it is then the turn's request, and
        writes on); any other is cancelled."""
        early = self._early_answer_to(gen, text, take=True)
        if early is None:
            return None
        if not early.answers(messages, sampling):
            early.completion.cancel()
            return None
        release = getattr(early.completion, "release", None)
        if release is not None:
            release()  # wanted now: it writes on
        return early.completion

    def _probes_words(self, persona: Persona) -> bool:
        return self.endpointer is not None and self.endpointer.can_probe_text and \
            persona.endpointing.mode == "semantic"

    def _answer_probes(self, persona: Persona) -> bool:
        """Whether the answer's own prefill can give the words' probe (see module docstring)."""
        return self._probes_words(persona) and bool(self.session) and \
            callable(getattr(self.backend, "generate_probing", None))

    def _probe_end_of_turn(self, gen: int, text: str, words_logprob: float | None) -> str | None:
        """The text signal for the endpointer, if it waits for one on this turn. Returns the words
        the answer's prefill is to probe instead (None: nothing left to probe)."""
        if self.endpointer is None or not self.endpointer.wants_text(gen):
            return None
        p_text = None
        try:
            words = strip_trailing_punctuation(text)
            if self._probed is not None and self._probed[:2] == (gen, words):
                p_text = self._probed[2]  # the last partial said these words: already probed
                self.book.set(gen, "text_probe_reused", 1)
            elif words and self._answer_probes(self.persona()):
                return words
            elif words:
                p_text = self.backend.probe_sentence_end(self._prompt(gen, self.persona(), words)[0], self.session)
        except Exception:  # refused or failed: the audio signal (or the long silence) still ends the turn
            log.warning("end-of-turn text probe failed", exc_info=True)
        self.endpointer.add_text(gen, p_text, words_logprob)
        return None

    def _submit(self, gen: int, messages: list[dict], persona: Persona, words: str | None,
                words_logprob: float | None) -> tuple[Completion, Callable[[], None]]:
        """The answer's request, probing ``words`` in its prefill when given. Returns it and what to
        call once it is over: the endpointer must hear about the words even if no probe came (the
        request was cancelled or failed before its prefill)."""
        if words is None:
            return self.backend.generate(messages, persona.sampling, self.session), lambda: None
        told = threading.Event()

        def tell(p_text: float | None) -> None:
            if not told.is_set():
                told.set()
                self.endpointer.add_text(gen, p_text, words_logprob)

        completion, probe_messages = None, None
        try:
            probe_messages = self._prompt(gen, persona, words)[0]
            completion = self.backend.generate_probing(messages, persona.sampling, self.session,
                                                       probe_messages, tell)
        except Exception:
            log.warning("the answer's end-of-turn probe failed", exc_info=True)
        if completion is not None:
            self.book.set(gen, "text_probe_in_answer", 1)
            return completion, lambda: tell(None)
        try:  # the words' tokens are not the prompt's head: probe them first, as other backends do
            tell(self.backend.probe_sentence_end(probe_messages or self._prompt(gen, persona, words)[0], self.session))
        except Exception:
            log.warning("end-of-turn text probe failed", exc_info=True)
            tell(None)
        return self.backend.generate(messages, persona.sampling, self.session), lambda: None

    def _prompt(self, gen: int, persona: Persona, user: str) -> tuple[list[dict], int]:
        """The turn's prompt and its length in tokens. The history is trimmed (oldest exchanges
        first) to the budget; the user's own words never are: a turn that does not fit even alone
        with the system prompt is refused (TurnRefused), not cut."""
        budget = min(self.config.history_token_budget, self.backend.context_length - persona.sampling.max_tokens)
        messages = self.history.messages(persona.full_system_prompt(), gen, user, self.backend.count_tokens,
                                         max(budget, 64), self.config.max_history_turns)
        num_tokens = self.backend.count_tokens(messages)
        if num_tokens >= self.backend.context_length:
            log.warning("turn %d refused: its prompt is %d tokens, the model's context %d (the user's text: %d "
                        "characters)", gen, num_tokens, self.backend.context_length, len(user))
            raise TurnRefused("That message is too long for me to read. Please say it in fewer words.")
        return messages, num_tokens

    def _answer(self, gen: int, user: str, words: str | None = None, words_logprob: float | None = None) -> Iterable[Frame]:
        persona = self.persona()
        if self.config.is_prewarm_enabled and self._shared_prompt is not None:
            self._share_system_prompt(persona)
        messages, num_prompt_tokens = self._prompt(gen, persona, user)
        self.history.begin(gen, user)
        chunker = SpeakableChunker(self.chunker_config, persona.speech)
        self.book.mark(gen, "llm_request")
        completion, on_end = self._adopt_early_answer(gen, user, messages, persona.sampling), lambda: None
        if completion is not None:
            self.book.set(gen, "early_answer_adopted", 1)
        else:
            completion, on_end = self._submit(gen, messages, persona, words, words_logprob)
        self.book.set(gen, "prompt_tokens", num_prompt_tokens)
        with self._lock:
            self._active = (gen, completion)
        if self.is_stale(gen):  # interrupted between the check in the loop and registering
            completion.cancel()
        text, num_deltas = [], 0
        try:
            for delta in completion:
                if self.is_stale(gen):
                    completion.cancel()
                    break
                if num_deltas == 0:
                    self.book.mark(gen, "llm_first_token")
                num_deltas += 1
                text.append(delta)
                yield TextDelta(gen=gen, text=delta)
                for piece in chunker.feed(delta):
                    yield from self._chunk(gen, piece, chunker, persona, completion)
            else:
                for piece in chunker.flush():
                    yield from self._chunk(gen, piece, chunker, persona)
        except BaseException:
            completion.cancel()
            self.history.drop(gen)  # a failed turn leaves no half exchange behind
            raise
        finally:
            on_end()
            with self._lock:
                self._active = None
        answer = "".join(text).strip()
        self.book.mark(gen, "llm_done")
        self.book.set(gen, "num_deltas", num_deltas)
        self.book.set(gen, "num_tokens", self._count_answer_tokens(answer))
        self.history.finish(gen, answer)
        yield AssistantDone(gen=gen, text=answer, is_interrupted=self.is_stale(gen),
                            num_tokens=num_deltas)

    def _count_answer_tokens(self, answer: str) -> int:
        """Tokens of the answer itself (deltas may be words, not tokens): the template's share removed."""
        if not answer:
            return 0
        empty = self.backend.count_tokens([{"role": "assistant", "content": ""}])
        return max(0, self.backend.count_tokens([{"role": "assistant", "content": answer}]) - empty)

    def _chunk(self, gen: int, text: str, chunker: SpeakableChunker, persona: Persona,
               completion: Completion | None = None) -> Iterable[Frame]:
        """One speakable chunk. The first, while the answer goes on (``completion``), holds the answer
        until its audio is made: on 2 cores the engine's next tokens and TTS's first words would share
        them, and it is the words the user waits for (the rest has the first chunk's playing time)."""
        self.book.mark(gen, "first_chunk_ready", time.monotonic())
        self.book.add(gen, "num_chunks", 1)
        index = chunker.num_chunks - 1
        holds = index == 0 and self.is_spoken and self.config.is_first_audio_first
        hold = getattr(completion, "hold", None) if holds else None
        if hold is not None:
            hold()
        yield SpeakChunk(gen=gen, text=text, index=index, voice=persona.voice,
                         on_synthesized=completion.release if hold is not None else None)
