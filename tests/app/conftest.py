"""Fixtures shared by the front-end tests."""
from __future__ import annotations

import io
import logging
import subprocess

import pytest

from tests.setup_needs import need_command


@pytest.fixture(scope="session")
def question_wav(tmp_path_factory):
    """A spoken question (espeak-ng, 22,050 Hz mono): "What is the capital of France?"."""
    espeak = need_command("espeak-ng")
    path = tmp_path_factory.mktemp("question") / "question.wav"
    subprocess.run([espeak, "-s", "150", "-w", str(path), "What is the capital of France?"], check=True)
    return path


@pytest.fixture
def log_stream():
    """Everything logged during the test, as Voxlane's structured key=value lines."""
    from app.logs import setup_logging

    stream = io.StringIO()
    handler = setup_logging("INFO", stream=stream)
    yield stream
    logging.getLogger().removeHandler(handler)
