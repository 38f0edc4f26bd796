"""``voxlane say "text" -o out.wav``: speak text with a persona's voice into a WAV file."""
from __future__ import annotations

import sys
import wave
from dataclasses import replace
from pathlib import Path

import numpy as np

from app import model_store
from app.commands.common import CommandError, config_from, persona_store
from pipeline.persona.store import PersonaNotFound
from pipeline.tts import TTSError, create_tts


def add_parser(sub) -> None:
    p = sub.add_parser("say", help="speak text into a WAV file with a persona's voice (Piper by default)")
    p.add_argument("text", nargs="+", help="what to say ('-' reads standard input)")
    p.add_argument("-o", "--output", type=Path, required=True, help="the WAV file to write (16-bit mono)")
    p.add_argument("--persona", help="whose voice and speaking rate (default: the config's personas.default)")
    p.add_argument("--backend", choices=("piper", "coqui", "flite", "espeak"), help="override the persona's TTS backend")
    p.add_argument("--rate", type=float, help="override the speaking rate (1.0 = natural)")


def run(args) -> int:
    config = config_from(args)
    text = sys.stdin.read() if args.text == ["-"] else " ".join(args.text)
    if not text.strip():
        raise CommandError("say: nothing to say")
    try:
        voice = persona_store(config).get(args.persona or config.personas.default).voice
    except PersonaNotFound as error:
        raise CommandError(str(error)) from error
    if args.backend:
        default_voice = {"piper": config.models.tts, "flite": "kal16", "espeak": "en-us", "coqui": voice.voice}
        voice = replace(voice, backend=args.backend, voice=default_voice[args.backend])
    rate = args.rate or voice.speaking_rate
    try:
        tts = create_tts(voice, resolve=lambda spec: model_store.resolve(spec, "tts"))
        pcm = np.concatenate([chunk for chunk in tts.synthesize(text, speaking_rate=rate)])
    except (TTSError, model_store.ModelError) as error:
        raise CommandError(f"say: {error}") from error
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(args.output), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(tts.sample_rate)
        out.writeframes(pcm.astype("<i2").tobytes())
    print(f"{args.output}: {len(pcm) / tts.sample_rate:.2f} s at {tts.sample_rate} Hz ({tts.name})", file=sys.stderr)
    return 0
