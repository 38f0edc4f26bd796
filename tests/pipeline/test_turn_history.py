"""A speculative answer the user spoke over leaves no exchange, whatever the threads' order: scripted
frames into a text-only pipeline (the LLM stage is its first stage), a fake LLM the test can hold
inside a turn's prompt (just before its history entry begins)."""
from __future__ import annotations

import threading

from pipeline.frames import Interrupt, SpeechEnded, Transcript
from pipeline.persona.store import PersonaStore
from pipeline.pipeline import Pipeline
from tests.pipeline.fakes import FakeBackend, SilentTTS
from tests.pipeline.test_pipeline_text import collect_turn

FRAGMENT, ANSWER = "What is the capital of?", "The capital of Spain is Madrid."


class HeldBackend(FakeBackend):
    """``hold``: the prompt whose last message is this user text is held in ``count_tokens`` (the LLM
    stage counts it right before the history entry begins) until ``go`` is set."""

    def __init__(self, hold: str | None = None):
        super().__init__([ANSWER], delay_s=0.0)
        self.hold = hold
        self.held, self.go = threading.Event(), threading.Event()

    def count_tokens(self, messages) -> int:
        if self.hold is not None and messages[-1] == {"role": "user", "content": self.hold}:
            self.hold = None
            self.held.set()
            assert self.go.wait(10)
        return super().count_tokens(messages)


def make(backend: HeldBackend) -> Pipeline:
    tts = SilentTTS()
    return Pipeline(llm=backend, tts=lambda voice: tts, personas=PersonaStore(), persona="nova")


def final(pipeline: Pipeline, gen: int, text: str, is_committed: bool) -> None:
    """ASR's final of turn ``gen``; with ``is_committed`` the VAD's end of turn as well."""
    pipeline._first.put(Transcript(gen=gen, text=text, is_final=True))
    if is_committed:
        pipeline._first.put(SpeechEnded(gen=gen))


def answer_heard(pipeline: Pipeline, gen: int) -> None:
    collect_turn(pipeline, gen)
    pipeline.report_playback(gen, 10 ** 9)


def answer_begun_after_the_user_spoke_again(is_committed: bool, words_after: str) -> tuple[list, list]:
    """The LLM stage is held in the fragment's prompt while the user speaks again: on after a pause
    (a resume: the turn was not committed) or in a new turn after the fragment's turn ended (a
    barge-in). Returns the history as (user, reply) and the next turn's prompt after the system's."""
    backend = HeldBackend(hold=FRAGMENT)
    with make(backend) as pipeline:
        gen = pipeline.turns.counter.next()
        pipeline._first.put(Interrupt(gen=gen, reason="barge-in"))
        final(pipeline, gen, FRAGMENT, is_committed)
        assert backend.held.wait(10)
        again = pipeline.turns.counter.next()
        pipeline._first.put(Interrupt(gen=again, reason="barge-in") if is_committed else
                            Interrupt(gen=again, reason="resume", resumes_gen=gen))
        backend.go.set()
        final(pipeline, again, words_after, is_committed=True)
        answer_heard(pipeline, again)
        return [(e.user, e.reply) for e in pipeline.history], backend.calls[-1][1:]


def test_a_speculative_answer_that_begins_after_the_user_went_on_leaves_no_exchange():
    """The fragment's final was still being read by the LLM stage when the user went on (under
    load, seen in the thinking-pause converse test): its exchange began after the resume had
    dropped the turn's answer, and stayed with an empty reply, in the history and in the prompt
    of the whole sentence."""
    history, prompt = answer_begun_after_the_user_spoke_again(False, "What is the capital of Spain?")
    assert history == [("What is the capital of Spain?", ANSWER)]
    assert prompt == [{"role": "user", "content": "What is the capital of Spain?"}]
