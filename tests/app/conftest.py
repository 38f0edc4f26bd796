"""Fixtures shared by the front-end tests."""
from __future__ import annotations

import io
import logging
import shutil
import subprocess

import pytest


@pytest.fixture(scope="session")
def question_wav(tmp_path_factory):
    """A spoken question (espeak-ng, 22,050 Hz mono): "What is the capital of France?"."""
    if not shutil.which("espeak-ng"):
        pytest.skip("espeak-ng is needed to speak the test question (apt-get install espeak-ng)")
    path = tmp_path_factory.mktemp("question") / "question.wav"
    subprocess.run(["espeak-ng", "-s", "150", "-w", str(path), "What is the capital of France?"], check=True)
    return path


@pytest.fixture
def log_stream():
    """Everything logged during the test, as Voxlane's structured key=value lines."""
    from app.logs import setup_logging

    stream = io.StringIO()
    handler = setup_logging("INFO", stream=stream)
    yield stream
    logging.getLogger().removeHandler(handler)
