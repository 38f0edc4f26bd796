"""Structured logs carry the session, in the server's tasks and in threads started for a session."""
from __future__ import annotations

import contextvars
import io
import json
import logging
import threading

from app.logs import session_context, setup_logging


def test_lines_name_their_session_in_tasks_and_session_threads(log_stream):
    log = logging.getLogger("voxlane.test")
    log.info("outside")
    with session_context("s-42"):
        log.info("inside")
        ctx = contextvars.copy_context()  # what a session's stage threads run in
        thread = threading.Thread(target=ctx.run, args=(log.warning, "from a stage thread"))
        thread.start()
        thread.join()
    lines = log_stream.getvalue().splitlines()
    assert 'session=- msg="outside"' in lines[0]
    assert 'level=info logger=voxlane.test session=s-42 msg="inside"' in lines[1]
    assert 'level=warning' in lines[2] and 'session=s-42 msg="from a stage thread"' in lines[2]


def test_json_lines():
    stream = io.StringIO()
    handler = setup_logging("INFO", as_json=True, stream=stream)
    try:
        with session_context("abc"):
            try:
                raise ValueError("boom")
            except ValueError:
                logging.getLogger("voxlane.test").exception("failed")
        record = json.loads(stream.getvalue().splitlines()[0])
        assert record["session"] == "abc" and record["msg"] == "failed" and "ValueError: boom" in record["exc"]
    finally:
        logging.getLogger().removeHandler(handler)
