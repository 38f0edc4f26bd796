"""A real browser talks to ``voxlane serve``: headless Chromium (Debian's) with a fake microphone
playing a spoken question opens the page, goes hands-free, and must show the transcript and the
reply, and play non-silent reply audio through the page's audio output (the playback worklet).

The screenshot goes to artifacts/ (gitignored); its path is printed.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "artifacts"
pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, process: subprocess.Popen, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"voxlane serve exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not healthy after {timeout_s} s")


@pytest.fixture(scope="module")
def question_wav(tmp_path_factory) -> Path:
    """The question, then 40 s of silence: Chromium loops the file, and the question must be
    asked once within the test."""
    if not shutil.which("espeak-ng") or not shutil.which("sox"):
        pytest.skip("espeak-ng and sox are needed to make the spoken question")
    folder = tmp_path_factory.mktemp("browser")
    raw, wav = folder / "raw.wav", folder / "question.wav"
    subprocess.run(["espeak-ng", "-s", "150", "-w", str(raw), "What is the capital of France?"], check=True)
    subprocess.run(["sox", str(raw), "-r", "48000", "-c", "1", "-b", "16", str(wav), "pad", "0.5", "40"], check=True)
    return wav


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = _free_port()
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1")
    backend = os.environ.get("VOXLANE_TEST_BACKEND", "transformers")
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "app", "serve", "--port", str(port), "--backend", backend],
                                   cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}/healthz", process, timeout_s=300)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        print(f"server log: {log_path}")


def _launch(pw, wav: Path, profile_name: str):
    profile = ARTIFACTS / profile_name
    shutil.rmtree(profile, ignore_errors=True)
    args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={wav}", "--autoplay-policy=no-user-gesture-required"]
    return pw.chromium.launch_persistent_context(str(profile), executable_path=CHROMIUM, headless=True,
                                                 args=args, viewport={"width": 1200, "height": 900})


@pytest.fixture(scope="module")
def playwright():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        yield pw


@pytest.fixture(scope="module")
def browser(playwright, question_wav):
    """Headless Chromium whose fake microphone loops the question file."""
    context = _launch(playwright, question_wav, "chromium-profile")
    try:
        yield context
    finally:
        context.close()


def _open_page(browser, server: str, console: list[str], external: list[str]):
    page = browser.new_page()
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    # The page must work offline: note any request that leaves this machine.
    page.on("request", lambda r: external.append(r.url)
            if not r.url.startswith((server, "data:", "blob:", "ws://127.0.0.1")) else None)
    page.goto(server + "/", wait_until="load", timeout=120_000)
    page.wait_for_selector("#vx-hands", timeout=120_000)
    return page


def test_browser_talks_hands_free(server, browser):
    console: list[str] = []
    external: list[str] = []
    page = _open_page(browser, server, console, external)
    try:
        page.click("#vx-hands")
        page.wait_for_function("window.voxlaneStats && window.voxlaneStats.connected", timeout=120_000)
        # Transcript, reply, and reply audio that actually reached the page's audio output.
        page.wait_for_function("window.voxlaneStats.lastTranscript", timeout=180_000)
        page.wait_for_function("window.voxlaneStats.lastReply && window.voxlaneStats.nonSilentSamples > 4800",
                               timeout=180_000)
        page.wait_for_function("Object.keys(window.voxlaneStats.firstSoundMs).length > 0", timeout=180_000)
        page.wait_for_function("window.voxlaneStats.turns.length > 0", timeout=180_000)
        stats = page.evaluate("window.voxlaneStats")
        user_text = page.inner_text("#vx-chat .vx-user:not(.vx-empty)")
        reply_text = page.inner_text("#vx-chat .vx-assistant")
        shot = ARTIFACTS / "browser-e2e.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"\nscreenshot: {shot}")
    finally:
        page.close()
    print(f"transcript: {stats['lastTranscript']!r}\nreply: {stats['lastReply']!r}")
    print(f"played samples: {stats['playedSamples']}, non-silent: {stats['nonSilentSamples']}, peak: {stats['peak']:.3f}")
    for turn in stats["turns"]:
        print(f"turn {turn['gen']}: server waterfall (ms) {turn['waterfall'].get('ms')}; "
              f"browser: first reply sound {turn.get('browser_first_sound_ms')} ms after the question's last voiced frame")
    assert "capital" in user_text.lower() or "france" in user_text.lower(), (user_text, console)
    assert reply_text.strip(), console
    assert stats["peak"] > 0.01
    assert not stats["errors"], stats["errors"]
    assert not external, f"the page fetched from outside: {external[:5]}"


def test_browser_barge_in_stops_the_reply(server, browser):
    """As the pirate, a typed question with a long answer; while it speaks, the user presses
    "Hold to talk": the reply's audio stops at once and the reply is marked interrupted."""
    console: list[str] = []
    page = _open_page(browser, server, console, [])
    try:
        page.select_option("#vx-persona", "pirate")
        page.fill("#vx-input", "Tell me a long story about a dragon and a brave knight.")
        page.press("#vx-input", "Enter")
        page.wait_for_function("window.voxlaneStats.state === 'speaking'", timeout=180_000)
        gen = page.evaluate("Math.max(...Object.keys(window.voxlaneStats.heard).map(Number))")
        acks = page.evaluate("window.voxlaneStats.flushAcks")
        page.hover("#vx-talk")
        page.mouse.down()
        page.wait_for_function("window.voxlaneStats.interruptions.some(i => i.gen > %d)" % gen, timeout=60_000)
        # the playback worklet confirms it dropped the audio (its report then holds what was heard)
        page.wait_for_function(f"window.voxlaneStats.flushAcks > {acks}", timeout=60_000)
        heard_at_stop = page.evaluate(f"window.voxlaneStats.heard[{gen}]")
        page.wait_for_timeout(1000)  # then nothing more of that turn is played
        heard_later = page.evaluate(f"window.voxlaneStats.heard[{gen}]")
        page.mouse.up()
        interrupted = page.locator("#vx-chat .vx-assistant.vx-interrupted").count()
        page.screenshot(path=str(ARTIFACTS / "browser-barge-in.png"), full_page=True)
        errors = page.evaluate("window.voxlaneStats.errors")
        persona = page.evaluate("window.voxlaneStats.ready.persona")
    finally:
        page.close()
    print(f"\nturn {gen}: {heard_at_stop:.0f} samples heard when stopped, {heard_later:.0f} one second later")
    assert persona == "pirate"
    assert heard_later == heard_at_stop
    assert interrupted >= 1
    assert not errors, errors


def test_browser_hands_free_barge_in_by_voice(server, playwright, tmp_path):
    """Hands-free: the user asks for a long story, then speaks again 3 s after their question
    ended — over the reply (or, on a slow machine, before it starts). The new speech interrupts
    turn 1: none of its audio plays after that, and the new words are transcribed."""
    raw1, raw2, wav = tmp_path / "q1.wav", tmp_path / "q2.wav", tmp_path / "both.wav"
    subprocess.run(["espeak-ng", "-s", "150", "-w", str(raw1), "Tell me a long story about a dragon."], check=True)
    subprocess.run(["espeak-ng", "-s", "150", "-w", str(raw2), "Stop. What is the capital of Spain?"], check=True)
    padded = tmp_path / "q1-padded.wav"
    subprocess.run(["sox", str(raw1), str(padded), "pad", "0.5", "3.0"], check=True)
    subprocess.run(["sox", str(padded), str(raw2), "-r", "48000", "-c", "1", "-b", "16", str(wav), "pad", "0", "40"],
                   check=True)
    context = _launch(playwright, wav, "chromium-profile-barge-in")
    try:
        page = _open_page(context, server, [], [])
        page.click("#vx-hands")
        page.wait_for_function("window.voxlaneStats.interruptions.some(i => i.gen > 1 && i.reason === 'barge-in')",
                               timeout=240_000)
        was_speaking = page.evaluate("window.voxlaneStats.interruptions.find(i => i.gen > 1).hadAudio")
        page.wait_for_function("/spain/i.test(window.voxlaneStats.lastTranscript || '')", timeout=240_000)
        heard_at_stop = page.evaluate("window.voxlaneStats.heard[1] || 0")  # long after the worklet's flush
        page.wait_for_timeout(1000)
        heard_later = page.evaluate("window.voxlaneStats.heard[1] || 0")
        users = page.locator("#vx-chat .vx-user").all_inner_texts()
        page.screenshot(path=str(ARTIFACTS / "browser-voice-barge-in.png"), full_page=True)
        errors = page.evaluate("window.voxlaneStats.errors")
    finally:
        context.close()
    print(f"\nturn 1 {'had audio queued' if was_speaking else 'had no audio yet'} when the user spoke again; "
          f"{heard_at_stop:.0f} samples of it heard then, {heard_later:.0f} later; user turns {users}")
    assert heard_later == heard_at_stop
    assert len(users) == 2 and "spain" in users[-1].lower()  # two user turns, no abandoned bubble
    assert not errors, errors
