"""``EngineBackend`` as the voice pipeline sees it (the LLMBackend protocol)."""
from __future__ import annotations

import pytest

from engine.backends.base import Completion, LLMBackend
from engine.backends.engine_backend import EngineBackend
from engine.config import EngineConfig
from engine.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def backend(smollm2_dir):
    backend = EngineBackend(smollm2_dir, EngineConfig(max_seq_len=512, num_slots=4, max_batch_size=4,
                                                      admission_window_ms=5))
    yield backend
    backend.close()


def test_protocol_and_conversation_turns(backend):
    assert isinstance(backend, LLMBackend)
    history = [{"role": "system", "content": "You are a helpful voice assistant."}]
    cached, prompts = [], []
    for question in ["Hello!", "What is the capital of France?", "And of Italy?"]:
        history.append({"role": "user", "content": question})
        completion = backend.generate(history, SamplingParams(temperature=0, max_tokens=12), session="call-1")
        assert isinstance(completion, Completion)
        answer = "".join(completion)
        assert answer and completion.finish_reason in ("stop", "length")
        cached.append(completion.cached_tokens)
        prompts.append(completion.prompt_tokens)
        history.append({"role": "assistant", "content": answer})
    # Later turns reuse the cache: each finds at least the whole previous prompt there. (The first
    # may find a little too: a slot freed by another session keeps its tokens for whoever shares them.)
    assert cached[0] < prompts[0] and cached[1] >= prompts[0] and cached[2] >= prompts[1], (cached, prompts)
    assert backend.count_tokens(history) > 30 and backend.context_length == 512
    backend.end_session("call-1")
    assert backend.stats().slots_held == 0


def test_cancel_ends_stream_and_frees_slot(backend):
    import time

    completion = backend.generate([{"role": "user", "content": "Tell me a long story about a dragon."}],
                                  SamplingParams(temperature=0, max_tokens=300))
    pieces = []
    for piece in completion:
        pieces.append(piece)
        if len(pieces) == 3:
            completion.cancel()
    assert completion.finish_reason == "cancelled" and len(pieces) < 8
    deadline = time.time() + 10
    while backend.stats().slots_busy and time.time() < deadline:
        time.sleep(0.01)
    assert backend.stats().slots_busy == 0


def test_sentence_end_probe_reads_unfinished_words_and_leaves_the_prefill_for_the_answer(backend):
    """The end-of-turn text signal: one prefill, no token sampled; fragments score far below
    finished requests; the session's slot keeps the prefill, so the answer reuses it."""
    system = {"role": "system", "content": "You are a helpful voice assistant."}

    def probe(text: str, session: str | None = None) -> float:
        return backend.probe_sentence_end([system, {"role": "user", "content": text}], session)

    for fragment, complete in [("What is the capital of", "What is the capital of France"),
                               ("Remind me to", "Remind me to buy milk tomorrow morning")]:
        p_fragment, p_complete = probe(fragment), probe(complete)
        assert 0.0 <= p_fragment < 0.01 < p_complete <= 1.0, (fragment, p_fragment, p_complete)
    assert probe("How many legs does", "probe-1") < probe("How many legs does a spider have", "probe-1")
    open_ids = backend.engine.encode_open_user_turn([system, {"role": "user", "content": "How many legs does a spider have"}])
    answer = backend.generate([system, {"role": "user", "content": "How many legs does a spider have?"}],
                              SamplingParams(temperature=0, max_tokens=4), session="probe-1")
    assert "".join(answer) and answer.cached_tokens >= len(open_ids) - 1
    assert backend.stats().slots_busy == 0 and backend.engine.num_open_requests == 0
    backend.end_session("probe-1")
    assert backend.probe_sentence_end([system, {"role": "user", "content": "  "}]) is None


def test_an_answer_whose_prefill_probes_its_words_is_one_request_with_the_probes_value(backend):
    """``generate_probing``: the answer and the words' end-of-turn probe in one request. The probe is
    the one ``probe_sentence_end`` gives (also when the slot already holds the words: that row is
    recomputed), it comes before the first token, and the answer is the plain greedy one."""
    system = {"role": "system", "content": "You are a helpful voice assistant."}
    greedy = SamplingParams(temperature=0, max_tokens=8)
    for text in ("What is the capital of Spain?", "What is the capital of"):
        words = [system, {"role": "user", "content": text.rstrip("?")}]
        asked = [system, {"role": "user", "content": text}]
        expected = backend.probe_sentence_end(words, "probe-2")  # leaves the words in the slot
        answer = "".join(backend.generate(asked, greedy, "probe-2"))
        backend.end_session("probe-2")
        for cached_words in (False, True):
            if cached_words:
                backend.probe_sentence_end(words, "probe-3")
            submitted, events = [], []
            submit = backend.engine.submit
            backend.engine.submit = lambda *a, **k: submitted.append(a) or submit(*a, **k)
            try:
                stream = backend.generate_probing(asked, greedy, "probe-3", words, lambda p: events.append(p))
                events += list(stream)
            finally:
                backend.engine.submit = submit
            backend.end_session("probe-3")
            assert len(submitted) == 1 and stream.finish_reason in ("stop", "length")
            assert events[0] == pytest.approx(expected, rel=1e-4, abs=1e-7) and stream.probe == events[0], text
            assert "".join(events[1:]) == answer
    # words that are not the head of the prompt: nothing submitted, the caller probes separately
    assert backend.generate_probing([system, {"role": "user", "content": "Hello."}], greedy, "probe-3",
                                    [system, {"role": "user", "content": "Goodbye"}], lambda p: None) is None
    assert backend.stats().slots_busy == 0 and backend.engine.num_open_requests == 0


def test_voice_sessions_of_one_persona_share_its_system_prompt_computed_once(backend):
    """Two pipelines (voice sessions) with the same persona: the engine prefills its system prompt
    once, and each session's first turn starts from a copy of it."""
    from pipeline.frames import TurnDone
    from pipeline.persona.store import PersonaStore
    from pipeline.pipeline import Pipeline
    from tests.pipeline.fakes import SilentTTS

    engine, personas = backend.engine, PersonaStore()
    before = engine.num_prefix_prefills
    system_ids = engine.system_prefix_ids(personas.get("pirate").full_system_prompt())
    for session in ("voice-a", "voice-b"):
        with Pipeline(llm=backend, tts=lambda voice: SilentTTS(), personas=personas, persona="pirate",
                      session=session) as pipeline:
            gen = pipeline.text_input("Ahoy, who are you?")
            while not isinstance(frame := pipeline.next_frame(30), TurnDone) or frame.gen != gen:
                assert frame is not None, "the turn never ended"
            assert frame.waterfall["counts"]["prompt_tokens"] > len(system_ids)
        backend.end_session(session)
    assert engine.num_prefix_prefills == before + 1
    assert engine.kv_cache.prefixes[tuple(system_ids)].num_copies >= 2
