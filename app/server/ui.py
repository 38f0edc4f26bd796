"""The Gradio page: layout, persona descriptions, and the talking widget.

The widget itself (press to talk, hands-free, chat with partial transcripts, persona picker, state
indicator, latency waterfall, barge-in) is plain JavaScript in app/server/static/ that speaks the
``/ws`` protocol with AudioWorklets for capture and playback. Why not Gradio's own streaming
audio: its chunk interval (``stream_every``, 0.5 s by default) and one HTTP event per chunk add
hundreds of milliseconds before the pipeline even sees the audio, and it cannot stop playback
mid-chunk for barge-in; the WebSocket path hands 20 ms frames straight to the VAD.
"""
from __future__ import annotations

import html
import json

import gradio as gr

from pipeline.persona.store import PersonaStore

HEAD = """
<script src="/static/voxlane-audio.js" defer></script>
<script src="/static/voxlane.js" defer></script>
<link rel="stylesheet" href="/static/voxlane.css">
"""


def _theme() -> gr.themes.Base:
    # System fonts only: the default Google-font theme would fetch from the internet and the page
    # must work offline.
    return gr.themes.Default(font=["ui-sans-serif", "system-ui", "sans-serif"],
                             font_mono=["ui-monospace", "Consolas", "monospace"])


def _persona_markdown(store: PersonaStore) -> str:
    lines = []
    for name in store.names():
        persona = store.get(name)
        lines.append(f"- **{name}** — {persona.description or persona.name}")
    return "\n".join(lines) or "No personas found."


def build_ui(store: PersonaStore, default_persona: str) -> gr.Blocks:
    """The page's Blocks. The widget mounts itself into ``#vx-root`` (see static/voxlane.js)."""
    names = store.names()
    root = (f'<div id="vx-root" data-personas="{html.escape(json.dumps(names))}" '
            f'data-default-persona="{html.escape(default_persona)}">Loading the voice widget…</div>')
    with gr.Blocks(title="Voxlane", analytics_enabled=False) as blocks:
        gr.Markdown("# Voxlane\nA local voice assistant: everything runs on this computer.")
        gr.HTML(root, js_on_load=None, elem_id="vx-widget")
        with gr.Accordion("Personas", open=False):
            gr.Markdown(_persona_markdown(store))
        with gr.Accordion("How to use", open=False):
            gr.Markdown(
                "- **Hold to talk**: hold the button (or the space bar) while you speak, release when done.\n"
                "- **Hands-free**: the assistant listens all the time and answers when you pause; "
                "speak over it to interrupt (barge-in). Use headphones, or rely on the browser's echo cancellation.\n"
                "- **Persona**: a new choice applies from your next turn.\n"
                "- The latency panel shows each turn's waterfall: end of your speech → transcript → "
                "first token → first speakable chunk → first audio → first audio played here.")
    return blocks
