"""``voxlane personas list|show|validate``."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from app.commands.common import CommandError, config_from, persona_store
from pipeline.persona.persona import load_persona
from pipeline.persona.store import PersonaNotFound
from pipeline.schema import SchemaError


def add_parser(sub) -> None:
    p = sub.add_parser("personas", help="list, show or validate personas (assets/personas and your own)")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    verbs.add_parser("list", help="every persona, where it comes from, and any invalid files")
    show = verbs.add_parser("show", help="one persona with all its settings")
    show.add_argument("name")
    validate = verbs.add_parser("validate", help="check persona files (default: all); exit 1 if any is invalid")
    validate.add_argument("files", nargs="*", type=Path)


def run(args) -> int:
    config = config_from(args)
    store = persona_store(config)
    if args.verb == "list":
        for persona in store.all():
            print(f"{persona.key:12} {persona.name:16} {persona.description}  [{persona.source}]")
        for key, error in store.errors().items():
            print(f"{key:12} INVALID: {error}")
        print(f"\nyour own personas: {Path(config.personas.user_dir).expanduser()} (same stem overrides)")
        return 0
    if args.verb == "show":
        try:
            persona = store.get(args.name)
        except PersonaNotFound as error:
            raise CommandError(str(error)) from error
        for key, value in dataclasses.asdict(persona).items():
            print(f"{key}: {value}")
        return 0
    files = args.files or sorted({p for d in store.dirs if d.is_dir() for p in d.glob("*.toml")})
    failures = 0
    for path in files:
        try:
            persona = load_persona(path)
            print(f"ok       {path} ({persona.name})")
        except SchemaError as error:
            failures += 1
            print(f"INVALID  {error}")
    return 1 if failures else 0
