"""Personas by name, from the shipped directory and the user's, re-read when a file changes.

A user file with the same stem overrides the shipped one. An edit takes effect at the next
``get()`` (the pipeline calls it at the start of every turn); a broken edit keeps the last good
version and the reason is kept in ``errors`` (and logged) until the file is fixed.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from pipeline.persona.persona import Persona, load_persona
from pipeline.schema import SchemaError

log = logging.getLogger(__name__)

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "assets" / "personas"


class PersonaNotFound(KeyError):
    """No persona of that name."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class _Entry:
    path: Path
    stamp: tuple[int, int]  # (mtime_ns, size): a change in either means re-read
    persona: Persona | None  # the last good version
    error: str | None


class PersonaStore:
    """Loads personas from ``dirs`` (later directories override earlier ones) and hot-reloads them."""

    def __init__(self, dirs: list[Path] | None = None):
        self.dirs = [Path(d).expanduser() for d in (dirs or [SHIPPED_DIR])]
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self.refresh()

    def _files(self) -> dict[str, Path]:
        files: dict[str, Path] = {}
        for directory in self.dirs:
            if directory.is_dir():
                for path in sorted(directory.glob("*.toml")):
                    files[path.stem] = path  # later dirs win
        return files

    def refresh(self) -> None:
        """Re-scan the directories and re-read changed files."""
        with self._lock:
            files = self._files()
            for key in list(self._entries):
                if key not in files:
                    del self._entries[key]
            for key, path in files.items():
                self._load(key, path)

    def _load(self, key: str, path: Path) -> None:
        try:
            stat = path.stat()
        except OSError:
            return
        stamp = (stat.st_mtime_ns, stat.st_size)
        entry = self._entries.get(key)
        if entry and entry.path == path and entry.stamp == stamp:
            return
        last_good = entry.persona if entry and entry.path == path else None
        try:
            persona, error = load_persona(path), None
        except SchemaError as failure:
            persona, error = last_good, str(failure)
            log.warning("persona %s: keeping the last good version: %s", key, failure)
        self._entries[key] = _Entry(path, stamp, persona, error)

    def get(self, name: str) -> Persona:
        """The current version of persona ``name`` (a file stem), re-read if its file changed."""
        self.refresh()
        with self._lock:
            entry = self._entries.get(name)
        if entry is None:
            raise PersonaNotFound(f"no persona named {name!r}; available: {', '.join(self.names()) or 'none'}")
        if entry.persona is None:
            raise PersonaNotFound(f"persona {name!r} is invalid and has no earlier good version:\n{entry.error}")
        return entry.persona

    def names(self) -> list[str]:
        with self._lock:
            return sorted(k for k, e in self._entries.items() if e.persona is not None)

    def errors(self) -> dict[str, str]:
        """Files whose current content is invalid, with the reason."""
        with self._lock:
            return {k: e.error for k, e in self._entries.items() if e.error}

    def all(self) -> list[Persona]:
        return [self.get(name) for name in self.names()]
