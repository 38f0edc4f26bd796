"""The malloc arena cap that keeps a server's memory flat (app/malloc_arenas.py); its effect on
memory under load is measured by tests/app/test_load_spoken.py."""
from __future__ import annotations

import platform

import pytest

from app.malloc_arenas import limit_malloc_arenas


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the cap is glibc's")
def test_applies_on_glibc(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert limit_malloc_arenas(2) is True


def test_the_users_setting_wins(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_malloc_arenas(2) is False


def test_a_cap_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        limit_malloc_arenas(0)
