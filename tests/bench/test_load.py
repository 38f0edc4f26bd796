"""``voxlane bench load``'s client side against the real server and pipeline with scripted models
(fast): 8 concurrent sessions x 5 typed turns, every answer on its own socket, everything freed.
The real-model load test is tests/app/test_load_spoken.py."""
from __future__ import annotations

import asyncio

import pytest

from bench.load import main, run_load, speak_questions
from tests.app.scripted_models import make_server
from tests.app.socket_checks import num_threads, wait_idle
from tests.setup_needs import need_command


@pytest.fixture(scope="module")
def questions(tmp_path_factory):
    need_command("espeak-ng")  # speaks the clients' questions
    return speak_questions(tmp_path_factory.mktemp("load"), 8)


def test_8_clients_5_turns_each_get_their_own_answers(silero_vad_path, questions):
    with make_server(silero_vad_path, max_sessions=8) as server:
        wait_idle(server)
        threads = num_threads()
        report = asyncio.run(run_load(server.ws_url, questions, 5, is_realtime=False, num_spoken=0))
        print("\n" + report.summary())
        assert not report.failures, report.failures
        assert len(report.turns) == 40 and report.turns_per_s > 0
        for turn in report.turns:  # the scripted model echoes: each reply names its own client's keyword
            keyword = questions[turn["client"]][0]
            assert turn["reply"] == f"You said: Tell me one fact about {keyword}..", turn
        assert "40/40 turns (8 clients x 5)" in report.summary() and "text-to-voice p50" in report.summary()
        assert report.rss_peak >= report.rss_before > 0
        wait_idle(server, threads)
        server.factory.close()


def test_bench_load_reports_failures_with_its_exit_code(silero_vad_path, capsys):
    """Spoken turns the scripted transcriber cannot hear time out: reported, exit code 1."""
    with make_server(silero_vad_path) as server:
        code = main(["--url", server.ws_url, "--clients", "1", "--turns", "1", "--fast", "--timeout", "2"])
        server.factory.close()
    out = capsys.readouterr()
    assert code == 1 and "FAILED client 0" in out.err and "0/1 turns" in out.out
