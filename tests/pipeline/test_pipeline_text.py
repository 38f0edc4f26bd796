"""Pipeline mechanics with a scripted LLM and a fake TTS: errors end a turn without hanging,
interrupts cancel generation and free the slot, history is cut at what was heard, persona edits
and switches apply at the next turn, close() ends every thread."""
from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

from pipeline.frames import AudioOut, ErrorFrame, Interrupt, TurnDone
from pipeline.persona.store import SHIPPED_DIR, PersonaStore
from pipeline.pipeline import Pipeline
from tests.pipeline.fakes import FakeBackend, SilentTTS


def collect_turn(pipeline: Pipeline, gen: int, timeout_s: float = 20.0) -> list:
    frames = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        frame = pipeline.next_frame(0.1)
        if frame is None:
            continue
        frames.append(frame)
        if isinstance(frame, TurnDone) and frame.gen == gen:
            return frames
    raise AssertionError(f"turn {gen} never ended; got {[type(f).__name__ for f in frames]}")


@pytest.fixture
def personas(tmp_path) -> PersonaStore:
    for path in SHIPPED_DIR.glob("*.toml"):
        shutil.copy(path, tmp_path / path.name)
    return PersonaStore([tmp_path])


def make(backend, personas, tts=None) -> Pipeline:
    tts = tts or SilentTTS()
    return Pipeline(llm=backend, tts=lambda voice: tts, personas=personas, persona="nova")


def test_a_failing_llm_ends_the_turn_with_an_error_and_the_next_turn_works(personas):
    backend = FakeBackend(["Second time lucky, everything works now."])
    backend.errors = [RuntimeError("engine fell over")]
    with make(backend, personas) as pipeline:
        frames = collect_turn(pipeline, pipeline.text_input("first"))
        errors = [f for f in frames if isinstance(f, ErrorFrame)]
        assert errors and errors[0].stage == "llm" and "engine fell over" in errors[0].detail
        assert "error" in frames[-1].waterfall["counts"]
        frames = collect_turn(pipeline, pipeline.text_input("second"))
        assert any(isinstance(f, AudioOut) for f in frames)
        assert [e.user for e in pipeline.history] == ["second"]  # the failed turn left no exchange


def test_a_failing_tts_chunk_reports_an_error_and_the_turn_still_ends(personas):
    backend = FakeBackend(["Fine words come first. Then the broken bit arrives here, sadly enough."])
    with make(backend, personas, SilentTTS(fail_on="broken")) as pipeline:
        frames = collect_turn(pipeline, pipeline.text_input("hi"))
        assert any(isinstance(f, ErrorFrame) and f.stage == "tts" for f in frames)
        assert any(isinstance(f, AudioOut) for f in frames)


def test_interrupt_cancels_generation_frees_the_slot_and_cuts_history(personas):
    backend = FakeBackend(["One two three four five six seven eight nine ten. " * 20], delay_s=0.02)
    with make(backend, personas) as pipeline:
        gen = pipeline.text_input("count for me")
        emitted = 0
        while emitted < 16000 * 4:  # SilentTTS: 1,600 samples a word, so 40 words are out
            frame = pipeline.next_frame(5)
            emitted += len(frame.pcm) if isinstance(frame, AudioOut) else 0
        pipeline.report_playback(gen, 16000 * 3)  # ... and the front end has played 30 of them
        new_gen = pipeline.interrupt()
        assert new_gen > gen
        for _ in range(200):  # the generation notices the cancel at its next token
            if backend.active == 0:
                break
            time.sleep(0.01)
        assert backend.active == 0
        (exchange,) = pipeline.history
        assert exchange.is_interrupted
        assert exchange.reply.split() == ("One two three four five six seven eight nine ten. " * 3).split()
        assert any(isinstance(f, Interrupt) for f in iter(lambda: pipeline.next_frame(0.2), None))


def test_history_reaches_the_next_prompt_and_persona_edits_apply_next_turn(personas):
    backend = FakeBackend(["Paris is the capital of France."])
    with make(backend, personas) as pipeline:
        gen = pipeline.text_input("capital of France?")
        collect_turn(pipeline, gen)
        pipeline.report_playback(gen, 10 ** 9)
        path = Path(personas.dirs[0]) / "nova.toml"
        path.write_text(path.read_text().replace("You are Nova", "You are Nova the Second"))
        collect_turn(pipeline, pipeline.text_input("and Italy?"))
        first, second = backend.calls
        assert "Nova the Second" not in first[0]["content"] and "Nova the Second" in second[0]["content"]
        assert second[1:] == [{"role": "user", "content": "capital of France?"},
                              {"role": "assistant", "content": "Paris is the capital of France."},
                              {"role": "user", "content": "and Italy?"}]
        pipeline.set_persona("pirate")
        collect_turn(pipeline, pipeline.text_input("ahoy"))
        assert "pirate" in backend.calls[-1][0]["content"]


def test_close_ends_every_thread(personas):
    before = {t.name for t in threading.enumerate()}
    pipeline = make(FakeBackend(), personas)
    assert {t.name for t in threading.enumerate()} - before >= {"stage-llm", "stage-tts"}
    pipeline.text_input("talk while I close")
    pipeline.close()
    pipeline.close()  # idempotent
    assert not [t for t in threading.enumerate() if t.name.startswith("stage-") and t.name not in before]


def test_sessions_share_models_but_not_history(personas):
    backend = FakeBackend(["An answer."])
    tts = SilentTTS()
    with make(backend, personas, tts) as alice, make(backend, personas, tts) as bob:
        collect_turn(alice, alice.text_input("I am Alice"))
        collect_turn(bob, bob.text_input("I am Bob"))
        assert [e.user for e in alice.history] == ["I am Alice"]
        assert [e.user for e in bob.history] == ["I am Bob"]
        assert [m["content"] for m in backend.calls[-1][1:]] == ["I am Bob"]


def test_audio_is_resampled_to_the_front_ends_rate_when_asked(personas):
    from pipeline.config import PipelineConfig, TTSConfig

    tts = SilentTTS(samples_per_word=1600)  # 16 kHz
    config = PipelineConfig(tts=TTSConfig(output_sample_rate=48000))
    with Pipeline(llm=FakeBackend(["Three words here."]), tts=lambda voice: tts, personas=personas,
                  persona="nova", config=config) as pipeline:
        audio = [f for f in collect_turn(pipeline, pipeline.text_input("hi")) if isinstance(f, AudioOut)]
    assert audio and all(f.sample_rate == 48000 for f in audio)
    assert sum(len(f.pcm) for f in audio) == 3 * 1600 * 3


def test_the_history_budget_is_capped_by_the_context_length(personas):
    """A model with a small context gets prompts that leave room for the answer (its
    ``max_tokens``), whatever ``llm.history_token_budget`` (1536) allows: the oldest exchanges go."""

    class SmallContext(FakeBackend):
        context_length = 250  # room for the prompt: 250 - max_tokens (120) = 130 tokens

    backend = SmallContext(["One two three four five six seven eight nine ten."])
    with make(backend, personas) as pipeline:
        for i in range(12):
            gen = pipeline.text_input(f"Question number {i}, with a few more words in it.")
            collect_turn(pipeline, gen)
            pipeline.report_playback(gen, 10 ** 9)  # heard (an unheard turn's words join the next turn's)
    room = SmallContext.context_length - personas.get("nova").sampling.max_tokens
    sizes = [backend.count_tokens(call) for call in backend.calls]
    print(f"prompt sizes {sizes}; room for the prompt {room} tokens")
    assert max(sizes) <= room
    last = backend.calls[-1]
    assert last[0]["role"] == "system" and last[-1]["content"] == "Question number 11, with a few more words in it."
    assert len(last) < 1 + 2 * 11 + 1  # some earlier exchanges were left out


def test_a_full_output_queue_drops_the_oldest_frames_and_never_blocks_the_voice(personas):
    """Nobody reads the output (a front end that stalled): the turn still runs to its end (the TTS
    thread never waits for a reader) and the queue keeps the newest ``output_queue_size`` frames,
    the turn's TurnDone last."""
    from pipeline.config import PipelineConfig, QueueConfig

    backend = FakeBackend([" ".join(["word"] * 80) + "."], delay_s=0)
    tts = SilentTTS(samples_per_word=16)
    with Pipeline(llm=backend, tts=lambda voice: tts, personas=personas, persona="nova",
                  config=PipelineConfig(queues=QueueConfig(output_queue_size=10))) as pipeline:
        gen = pipeline.text_input("Talk a lot.")
        deadline = time.monotonic() + 30
        while "audio_done" not in pipeline.book.marks(gen) and time.monotonic() < deadline:
            time.sleep(0.02)  # not reading: the queue overflows (80 deltas alone)
        assert "audio_done" in pipeline.book.marks(gen), "the turn stalled behind the full output queue"
        kept = []
        while (frame := pipeline.next_frame(0)) is not None:
            kept.append(frame)
    assert len(kept) == 10 and isinstance(kept[-1], TurnDone) and kept[-1].gen == gen
