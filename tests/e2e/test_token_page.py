"""A real browser opens a token-guarded server the way its user is told to, ``http://host:port/#token=…``
(issue 11, finding 9): the page loads, the token leaves the address bar, the page's own requests
and its WebSocket are authorized by the cookie, and no log line ever holds the token."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.app.scripted_models import make_server
from tests.app.socket_checks import LogLines

CHROMIUM = "/usr/bin/chromium"
TOKEN = "tok-0123456789abcdef-browser"
pytestmark = [pytest.mark.browser]


def test_the_page_takes_the_token_from_the_fragment(silero_vad_path):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    server = make_server(silero_vad_path, with_ui=True, host="127.0.0.2", access_token=TOKEN, log_level="info")
    lines = LogLines()  # attached after the server's uvicorn config, which replaces its loggers' handlers
    loggers = [logging.getLogger(n) for n in ("uvicorn.access", "uvicorn.error", "app")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(lines)
        logger.setLevel(logging.INFO)
    try:
        with server as running, sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
            page = browser.new_page()
            page.goto(f"{running.url}/#token={TOKEN}")
            page.wait_for_selector("#vx-root", timeout=60_000)  # the Gradio page itself, after the token page
            assert "token" not in page.url and TOKEN not in page.url, page.url
            reply = page.evaluate("""() => new Promise((resolve) => {
                const ws = new WebSocket("ws://" + location.host + "/ws");
                ws.onopen = () => ws.send(JSON.stringify({type: "start", version: 1, sample_rate: 16000}));
                ws.onmessage = (e) => { resolve(JSON.parse(e.data).type); ws.close(); };
                ws.onclose = (e) => resolve("closed " + e.code);
            })""")
            assert reply == "ready"  # no token in "start": the cookie carried it
            browser.close()
            running.factory.close()
    finally:
        for logger, level in zip(loggers, levels):
            logger.removeHandler(lines)
            logger.setLevel(level)
    assert any("/ws" in line for line in lines.lines), lines.lines  # the lines were captured...
    assert not [line for line in lines.lines if TOKEN in line]  # ...and none holds the token
