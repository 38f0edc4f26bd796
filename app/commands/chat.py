"""``voxlane chat``: text in, streamed text out, as a persona. One question, or a conversation on stdin."""
from __future__ import annotations

import sys

from app.backends import make_llm_backend
from app.commands.common import CommandError, config_from, persona_store
from app.config import LLM_BACKENDS
from engine.sampling_params import SamplingParams
from pipeline.persona.store import PersonaNotFound


def add_parser(sub) -> None:
    p = sub.add_parser("chat", help="text chat with a persona (streamed answers; a conversation on stdin)")
    p.add_argument("message", nargs="*", help="ask this and exit (default: read one message per line from stdin)")
    p.add_argument("--persona", help="persona name (default: the config's personas.default)")
    p.add_argument("--backend", choices=LLM_BACKENDS, help="LLM backend (default: the config's llm.backend)")
    p.add_argument("--greedy", action="store_true", help="temperature 0: the same answer every time")
    p.add_argument("--max-tokens", type=int, help="override the persona's max_tokens")


def run(args) -> int:
    config = config_from(args)
    store = persona_store(config)
    name = args.persona or config.personas.default
    try:
        store.get(name)
    except PersonaNotFound as error:
        raise CommandError(str(error)) from error
    backend = make_llm_backend(config, args.backend)
    interactive = not args.message and sys.stdin.isatty()
    history: list[dict[str, str]] = []
    try:
        lines = [" ".join(args.message)] if args.message else _stdin_lines(interactive)
        for line in lines:
            persona = store.get(name)  # re-read each turn: an edited persona applies at the next message
            sampling = _sampling(persona.sampling, args)
            messages = [{"role": "system", "content": persona.full_system_prompt()}, *history,
                        {"role": "user", "content": line}]
            answer = []
            if interactive:
                print(f"{persona.name}> ", end="", flush=True)
            for delta in backend.generate(messages, sampling, session="chat"):
                answer.append(delta)
                print(delta, end="", flush=True)
            print(flush=True)
            history += [{"role": "user", "content": line}, {"role": "assistant", "content": "".join(answer)}]
    except KeyboardInterrupt:
        print()
    finally:
        backend.close()
    return 0


def _stdin_lines(interactive: bool):
    while True:
        try:
            line = input("you> ") if interactive else sys.stdin.readline()
        except EOFError:
            return
        if not interactive and line == "":
            return
        if line.strip():
            yield line.strip()


def _sampling(base: SamplingParams, args) -> SamplingParams:
    from dataclasses import replace

    if args.greedy:
        base = replace(base, temperature=0.0)
    if args.max_tokens:
        base = replace(base, max_tokens=args.max_tokens)
    return base
