"""The load test on real models over a real socket (loopback, bounded in count and time):
8 concurrent clients, each asking its own spoken question (an espeak-ng WAV naming one keyword)
5 turns in a row in one session, all at once, through VAD, Whisper, our engine on SmolLM2 int8
and Piper.

Sized for the suite: whisper-tiny.en with two ASR workers (``[pipeline.asr] num_workers``), so
eight finals ending together are not serialized behind one decoder, and a terse persona
(8 greedy tokens), so the test measures the server under concurrency rather than long answers.
``voxlane bench load`` runs the same clients against the default config.

Checked: all 40 turns answered with speech and no error; no cross-talk (every transcript carries
its own client's keyword, every reply piece and audio frame belongs to its own turn, and each
client's transcripts and replies are exactly what one session on the server heard and answered);
afterwards sessions, threads and engine slots are back to baseline, no object of a session is
left, and the heap in use is what it was before the round, within HEAP_MARGIN."""
from __future__ import annotations

import asyncio
import collections
import gc

import psutil
import pytest

from app.config import AppConfig, ModelsConfig, PersonasConfig, ServerConfig
from app.malloc_arenas import limit_malloc_arenas
from app.pipeline_sessions import PipelineSessions
from app.server.app import create_app
from app.server.runner import BackgroundServer
from app.server.session import Session
from app.server.ws import SocketHandler
from bench.load import run_load, speak_questions
from pipeline.config import ASRConfig, PipelineConfig
from pipeline.frames import Frame
from pipeline.llm.history import Exchange, History
from pipeline.pipeline import Pipeline
from pipeline.stage import Stage
from pipeline.waterfall import TurnWaterfall, WaterfallBook
from tests.app.socket_checks import num_threads, wait_sessions_closed
from tests.heap import heap_in_use
from tests.setup_needs import need_command

pytestmark = pytest.mark.slow

TERSE = """name = "Terse"
description = "Answers in a few words."
system_prompt = "You are a voice assistant. Answer in one short sentence that names the topic."
[voice]
backend = "piper"
voice = "piper-en_US-joe-medium"
[sampling]
temperature = 0.0
max_tokens = 8
[speech]
rules = []
"""
MIB = 1 << 20
# Growth of the heap in use (tests/heap.py) over one round of 40 spoken turns after a warm-up
# round. Measured here (2026-11-30, 2 cores): +6.0, +1.4, +2.1, +2.2 MiB in the rounds after the
# first, so one warm-up round is enough. With prompts packed into one prefill, +21.8 at first
# (attention over all chunks' keys, and a oneDNN GEMM kept per prompt length: engine/quant.py
# gemm_rows); +4.0 and +5.0 once both were fixed. A leak of 0.4 MiB a turn (the audio of every
# turn kept, say) exceeds it. Not RSS: in the suite's process RSS also holds what glibc's arenas
# retain from the threads of every earlier test, which says nothing about this server (voxlane
# serve caps the arenas at start, and its RSS stays flat: docs/operations.md).
HEAP_MARGIN = 16 * MIB
WARM_UP_ROUNDS = 1


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    limit_malloc_arenas()  # as voxlane serve does (threads that earlier tests started keep their arenas)
    personas = tmp_path_factory.mktemp("personas")
    (personas / "terse.toml").write_text(TERSE)
    # stall_timeout_s: on 2 shared cores a queue of eight answers is slow, not stalled.
    config = AppConfig(server=ServerConfig(stall_timeout_s=120.0), models=ModelsConfig(asr="whisper-tiny.en"),
                       pipeline=PipelineConfig(asr=ASRConfig(num_workers=2, cpu_threads=1)),
                       personas=PersonasConfig(user_dir=personas, default="terse"))
    factory = PipelineSessions(config)
    factory.warm_up()
    opened = []
    open_pipeline = factory.open
    factory.open = lambda persona, session_id: opened.append(pipeline := open_pipeline(persona, session_id)) or pipeline
    app = create_app(config, factory, with_ui=False)
    with BackgroundServer(app) as running:
        running.factory, running.registry, running.opened = factory, app.state.registry, opened
        yield running
    factory.close()


@pytest.fixture(scope="module")
def questions(tmp_path_factory):
    need_command("espeak-ng")  # speaks the clients' questions
    return speak_questions(tmp_path_factory.mktemp("questions"), 8)


def memory() -> tuple[int, int]:
    """(heap in use, RSS) in bytes, after a full collection and malloc_trim."""
    return heap_in_use(), psutil.Process().memory_info().rss


def session_objects() -> collections.Counter:
    """Live objects of the kinds a session creates (its socket handler and Session, the Pipeline
    with its stages, history and waterfalls, frames): none may outlive a closed session (its
    threads are counted by num_threads). Counted by kind, not all objects: lazy imports and bounded
    caches elsewhere (asyncio's cancelled timers, the engine's last sequence per slot) come and go
    without being leaks."""
    kinds = (SocketHandler, Session, Pipeline, Stage, History, Exchange, WaterfallBook, TurnWaterfall, Frame)
    gc.collect()
    found = collections.Counter()
    for o in gc.get_objects():
        cls = type(o)  # not isinstance: that reads __class__, which some lazy module proxies warn about
        if issubclass(cls, kinds):
            found[next(kind.__name__ for kind in kinds if issubclass(cls, kind))] += 1
    return found


def exchanges_by_client(pipelines, questions) -> dict[int, list[tuple[str, str]]]:
    """Each closed session's (user, assistant) exchanges, keyed by the client whose keyword all its
    user turns carry (exactly one client per session, five turns each)."""
    found = {}
    for pipeline in pipelines:
        users = [e.user for e in pipeline.history]
        owners = {i for i, (keyword, _) in enumerate(questions) if all(keyword in u.lower() for u in users)}
        assert len(owners) == 1 and len(users) == 5, users
        found[owners.pop()] = [(e.user, e.assistant) for e in pipeline.history]
    return found


def spoken_round(server, questions):
    return asyncio.run(run_load(server.ws_url, questions, 5, is_realtime=False, timeout_s=120.0))


def test_8_clients_5_spoken_turns_each(server, questions):
    """A warm-up round first, the same 8 x 5 spoken turns: a fresh process grows over its first
    round (the engine's KV cache pages in as positions are first written, first-use allocations
    in every library). Then the measured round (and a second one if the first grew the heap)."""
    for _ in range(WARM_UP_ROUNDS):
        warm = spoken_round(server, questions)
        print(f"\nwarm-up: {warm.summary()}")
        assert not warm.failures, warm.failures
        wait_sessions_closed(server)
    server.opened.clear()
    threads, objects_before, (heap_before, rss_before) = num_threads(), session_objects(), memory()
    report = spoken_round(server, questions)
    print(report.summary())
    assert not report.failures, report.failures
    assert len(report.turns) == 40 and all(t["is_spoken"] and t["audio_samples"] > 0 for t in report.turns)

    # No cross-talk: each client's turns are exactly one server session's exchanges, in order.
    wait_sessions_closed(server, threads)
    sessions = exchanges_by_client(server.opened, questions)
    server.opened.clear()  # the closed pipelines are not part of "after"
    for client in range(len(questions)):
        turns = sorted((t for t in report.turns if t["client"] == client), key=lambda t: t["turn"])
        assert [(t["transcript"], t["reply"].strip()) for t in turns] == sessions[client]

    stats = server.factory.llm.stats()
    assert stats.slots_busy == 0 and stats.slots_held == 0 and stats.waiting == 0
    objects_after, (heap_after, rss_after) = session_objects(), memory()
    print(f"heap in use {heap_before / MIB:.0f} -> {heap_after / MIB:.0f} MiB ({(heap_after - heap_before) / MIB:+.1f}); "
          f"RSS {rss_before / MIB:.0f} -> {rss_after / MIB:.0f} MiB; session objects left {dict(objects_after)}")
    assert objects_after == objects_before
    if abs(heap_after - heap_before) >= HEAP_MARGIN:
        # The heap is the whole test process's: under pytest-xdist this worker ran other modules
        # first, and their leftovers once grew it by 133 MiB during one round (RSS +43 MiB; seen in
        # CI, not in the next 2-worker run). A leak grows it again in the next identical round: a
        # one-off does not.
        heap_before = heap_after
        again = spoken_round(server, questions)
        assert not again.failures, again.failures
        wait_sessions_closed(server, threads)
        server.opened.clear()
        heap_after = memory()[0]
        print(f"another round: heap in use {heap_before / MIB:.0f} -> {heap_after / MIB:.0f} MiB "
              f"({(heap_after - heap_before) / MIB:+.1f})")
        assert session_objects() == objects_before
    assert abs(heap_after - heap_before) < HEAP_MARGIN
