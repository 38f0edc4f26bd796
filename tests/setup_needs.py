"""What a test needs from the machine's set-up (Debian packages, test extras), and what happens
when it is missing.

``./dev test`` (and CI, which runs it) has just installed all of it, so there a missing piece is
an ERROR: a run without espeak-ng, sox or Chromium must not "pass" by skipping the spoken, client
and browser tests. ``./dev test`` says so by setting ``VOXLANE_TEST_REQUIRE_SETUP=1``. A bare
``pytest`` on a machine set up by hand skips such tests instead, naming the package to install.
A skip for what set-up cannot provide (Coqui TTS with this torch) stays a skip everywhere.
"""
from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path

import pytest

REQUIRE_SETUP = "VOXLANE_TEST_REQUIRE_SETUP"


def is_setup_required() -> bool:
    return os.environ.get(REQUIRE_SETUP, "") not in ("", "0")


def missing(what: str) -> None:
    """Fails the test under ``./dev test``; skips it otherwise."""
    if is_setup_required():
        pytest.fail(f"{what}; ./dev setup installs it ({REQUIRE_SETUP} is set: set-up pieces may not be skipped)",
                    pytrace=False)
    pytest.skip(what)


def need_command(name: str, package: str | None = None) -> str:
    """The path of command ``name`` (from Debian package ``package``)."""
    path = shutil.which(name)
    if path is None:
        missing(f"{name} is needed (apt-get install {package or name})")
    return path


def need_file(path: str | Path, package: str) -> Path:
    if not Path(path).exists():
        missing(f"{path} is needed (apt-get install {package})")
    return Path(path)


def need_module(name: str, why: str):
    """An importable module (a test extra or a library a Debian package provides)."""
    try:
        return importlib.import_module(name)
    except (ImportError, OSError) as error:
        missing(f"{name} cannot be imported ({why}): {error}")
