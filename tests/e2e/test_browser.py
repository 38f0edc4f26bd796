"""A real browser talks to ``voxlane serve`` on the configured default backend (our engine):
headless Chromium (Debian's) with a fake microphone playing a spoken question opens the page, goes
hands-free, and must show the transcript and the reply, and play non-silent reply audio through the
page's audio output (the playback worklet).

The screenshot goes to artifacts/ (gitignored); its path is printed.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.serve_process import ServeProcess
from tests.setup_needs import need_command, need_file

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "artifacts"
pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def question_wav(tmp_path_factory) -> Path:
    """The question, then 40 s of silence: Chromium loops the file, and the question must be
    asked once within the test."""
    espeak, sox = need_command("espeak-ng"), need_command("sox")
    folder = tmp_path_factory.mktemp("browser")
    raw, wav = folder / "raw.wav", folder / "question.wav"
    subprocess.run([espeak, "-s", "150", "-w", str(raw), "What is the capital of France?"], check=True)
    subprocess.run([sox, str(raw), "-r", "48000", "-c", "1", "-b", "16", str(wav), "pad", "0.5", "40"], check=True)
    return wav


# A persona of the user's own (in the server's user persona folder) whose answer to "tell me a
# long story" is long and the same every run: greedy, no "one to three sentences" rule. With a
# shipped persona (Nova samples at 0.6 and answers in up to three sentences) the story was
# sometimes over, 7 s of audio, before the user spoke again.
STORYTELLER = """
name = "Storyteller"
description = "Tells long stories (a test persona)."
system_prompt = "You are a storyteller. When asked for a story, tell a long one of at least ten sentences."

[voice]
backend = "piper"
voice = "piper-en_US-joe-medium"

[sampling]
temperature = 0.0
max_tokens = 200

[speech]
rules = ["Never use lists, markdown, code, emoji or URLs."]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``voxlane serve`` as started by ``./dev run``: no --backend, so the configured default; the
    user's persona folder holds only STORYTELLER."""
    served = ServeProcess(tmp_path_factory.mktemp("serve"))
    (served.personas_dir / "storyteller.toml").write_text(STORYTELLER)
    with served:
        yield served.url


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
    need_file(CHROMIUM, "chromium")
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


def heard_prefix_prompts(smollm2_dir, system: str, user1: str, spoken: str, written: str, user2: str) -> list[int]:
    """Prompt lengths (tokens, as the engine counts them; ``system`` the persona's whole system
    prompt) of turn 2 when turn 1's reply is
    remembered as the first k words of its ``spoken`` chunks, cut off ("..."), for every k; last,
    the length with everything the model ``written``, not cut."""
    from engine.loader import chat_prompt_ids, load_tokenizer

    tokenizer = load_tokenizer(smollm2_dir)

    def count(assistant: str) -> int:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user1},
                    {"role": "assistant", "content": assistant}, {"role": "user", "content": user2}]
        return len(chat_prompt_ids(tokenizer, messages))

    words = spoken.split()
    return [count(" ".join(words[:k]) + "...") for k in range(len(words) + 1)] + [count(written)]


def test_browser_hands_free_barge_in_by_voice(server, playwright, smollm2_dir, tmp_path):
    """Hands-free, as the Storyteller: the user asks for a long story, then speaks again 8 s after
    their question ended, while the reply is playing. The new speech pauses the reply at once and interrupts
    turn 1: none of its audio plays after that, the new words are transcribed and answered, and
    the answer's prompt remembers turn 1 only as far as the browser played it."""
    espeak, sox = need_command("espeak-ng"), need_command("sox")
    raw1, raw2, wav = tmp_path / "q1.wav", tmp_path / "q2.wav", tmp_path / "both.wav"
    subprocess.run([espeak, "-s", "150", "-w", str(raw1), "Tell me a long story about a dragon."], check=True)
    subprocess.run([espeak, "-s", "150", "-w", str(raw2), "And what is the capital of Spain?"], check=True)
    padded = tmp_path / "q1-padded.wav"
    subprocess.run([sox, str(raw1), str(padded), "pad", "0.5", "8.0"], check=True)
    subprocess.run([sox, str(padded), str(raw2), "-r", "48000", "-c", "1", "-b", "16", str(wav), "pad", "0", "40"],
                   check=True)
    context = _launch(playwright, wav, "chromium-profile-barge-in")
    try:
        page = _open_page(context, server, [], [])
        page.select_option("#vx-persona", "storyteller")
        page.click("#vx-hands")
        # (Every utterance's start is a "barge-in" interruption; the one that matters comes after
        # reply audio was heard.)
        first_heard = "Math.min(...Object.keys(window.voxlaneStats.heard).map(Number))"
        page.wait_for_function("Object.keys(window.voxlaneStats.heard).length && window.voxlaneStats.interruptions"
                               f".some(i => i.reason === 'barge-in' && i.gen > {first_heard})", timeout=240_000)
        page.wait_for_function("/spain/i.test(window.voxlaneStats.lastTranscript || '')", timeout=240_000)
        page.wait_for_function(f"window.voxlaneStats.turns.some(t => t.gen > {first_heard} "
                               "&& (t.waterfall.counts || {}).prompt_tokens)", timeout=240_000)
        page.wait_for_timeout(1000)
        stats = page.evaluate("window.voxlaneStats")
        users = page.locator("#vx-chat .vx-user").all_inner_texts()
        replies = page.locator("#vx-chat .vx-assistant").all_inner_texts()
        page.screenshot(path=str(ARTIFACTS / "browser-voice-barge-in.png"), full_page=True)
    finally:
        context.close()
    gen = min(int(g) for g in stats["heard"] if stats["heard"][g] > 0)  # turn 1's reply, heard in part
    assert any(i["reason"] == "barge-in" and i["gen"] > gen for i in stats["interruptions"]), stats["interruptions"]
    # Reply audio was playing when the user started speaking again: a pause came with part of
    # turn 1 heard ...
    pauses = [p for p in stats["pauses"] if p["heard"].get(str(gen), 0) > 0]
    assert pauses, f"no pause while turn {gen} played: {stats['pauses']}"
    heard_at_pause, heard_final = pauses[-1]["heard"][str(gen)], stats["heard"][str(gen)]
    rate = next(a["sample_rate"] for a in stats["audio"] if a["gen"] == gen)
    print(f"\nturn {gen}: {heard_at_pause:.0f} samples heard when paused (state {pauses[0]['state']!r}), "
          f"{heard_final:.0f} in the end; user turns {users}")
    # The reply was still going: less of it had played than the server had sent, or the server was
    # still making it (no "turn" message for it yet: on a loaded machine a long next chunk can
    # come late and the buffer run dry mid-reply, seen at load 6 with 1.3 s heard). On a quiet one
    # the server has sent the whole story long before the pause (seen in CI: 7.9 s of 42 s played).
    # (Not the page's "speaking" at that instant, which shows "listening" while the buffer is dry.)
    sent = max(a["start_sample"] + a["samples"] for a in stats["audio"] if a["gen"] == gen)
    still_queued, still_coming = heard_at_pause < sent, gen not in pauses[-1]["finished"]
    assert heard_at_pause <= sent and (still_queued or still_coming), (pauses[-1], sent)
    # ... and nothing more of it played after the pause, beyond what was already in the audio
    # device's buffer when the pause message came (a few 128-sample render quanta: < 0.2 s).
    assert 0 <= heard_final - heard_at_pause < 0.2 * rate
    assert len(users) == 2 and "spain" in users[-1].lower()  # two user turns, no abandoned bubble
    assert not stats["errors"], stats["errors"]

    # The history keeps what was heard: turn 2's prompt holds turn 1's reply up to the played
    # position (to within the word under the cut), not all the model wrote.
    from pipeline.playback import PlaybackTracker

    tracker, chunks = PlaybackTracker(), {}
    for a in (a for a in stats["audio"] if a["gen"] == gen):
        tracker.on_audio(gen, a["chunk_index"], a["text"], a["start_sample"], a["samples"], a["sample_rate"])
        chunks.setdefault(a["chunk_index"], a["text"])
    tracker.report(gen, round(heard_final))
    heard = tracker.heard_text(gen)  # as the server computes it from the page's "played" reports
    answer = next(t for t in stats["turns"] if t["gen"] > gen and (t["waterfall"].get("counts") or {}).get("prompt_tokens"))
    prompt_tokens = answer["waterfall"]["counts"]["prompt_tokens"]
    spoken = " ".join(chunks[i] for i in sorted(chunks))
    from pipeline.persona.persona import load_persona

    (tmp_path / "storyteller.toml").write_text(STORYTELLER)
    system = load_persona(tmp_path / "storyteller.toml").full_system_prompt()
    options = heard_prefix_prompts(smollm2_dir, system, users[0], spoken, replies[0], users[1])
    k = len(heard.split())
    print(f"heard {heard!r}; turn {answer['gen']}'s prompt: {prompt_tokens} tokens "
          f"(heard words {k}: {options[k]}; the whole reply: {options[-1]})")
    assert prompt_tokens in options[max(0, k - 1):k + 2], (prompt_tokens, options)
    assert prompt_tokens < options[-1]
