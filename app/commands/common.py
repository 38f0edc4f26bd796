"""What several commands need: the config (with a clear refusal when it is invalid), personas."""
from __future__ import annotations

import sys

from app.config import AppConfig, load_config
from pipeline.persona.store import PersonaStore, SHIPPED_DIR
from pipeline.schema import SchemaError


class CommandError(SystemExit):
    """Ends a command with a message on stderr and exit code 2."""

    def __init__(self, message: str):
        print(f"voxlane: {message}", file=sys.stderr)
        super().__init__(2)


def config_from(args) -> AppConfig:
    try:
        return load_config(getattr(args, "config", None))
    except SchemaError as error:
        raise CommandError(f"refusing to start with an invalid config:\n{error}") from error


def persona_store(config: AppConfig) -> PersonaStore:
    return PersonaStore([SHIPPED_DIR, config.personas.user_dir])
