"""Personas: the shipped ones, every kind of invalid file, hot reload, user overrides."""
from __future__ import annotations

import os
import shutil

import pytest

from pipeline.persona.persona import load_persona
from pipeline.persona.store import SHIPPED_DIR, PersonaNotFound, PersonaStore
from pipeline.schema import SchemaError

VALID = """
name = "Tester"
system_prompt = "You test things."
[sampling]
temperature = 0.2
max_tokens = 50
"""


def _touch_later(path):
    # mtime granularity can be coarse; make the change visible even within one tick
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))


def test_at_least_three_distinct_shipped_personas_all_valid():
    store = PersonaStore([SHIPPED_DIR])
    assert store.errors() == {}
    personas = store.all()
    assert len(personas) >= 3
    assert len({p.system_prompt for p in personas}) == len(personas)
    assert len({(p.voice.speaking_rate, p.sampling.temperature) for p in personas}) == len(personas)
    for p in personas:
        assert p.greeting and p.description
        assert "spoken" in p.full_system_prompt() or "speak" in p.full_system_prompt()


def test_valid_file_loads_every_section(tmp_path):
    path = tmp_path / "tester.toml"
    path.write_text(VALID + '[voice]\nbackend = "espeak"\nvoice = "en-us"\nspeaking_rate = 1.3\n'
                    '[endpointing]\nsilence_ms = 800\n[speech]\nrules = ["Be brief."]\nstrip_emoji = false\n')
    persona = load_persona(path)
    assert persona.key == "tester"
    assert persona.sampling.temperature == 0.2 and persona.sampling.max_tokens == 50
    assert persona.voice.backend == "espeak" and persona.voice.speaking_rate == 1.3
    assert persona.endpointing.silence_ms == 800
    assert persona.full_system_prompt().endswith("Be brief.")
    assert persona.speech.strip_emoji is False


@pytest.mark.parametrize("text, key, words", [
    ('system_prompt = "x"\n', "name", "missing"),
    ('name = "A"\nsystem_prompt = "   "\n', "system_prompt", "must not be empty"),
    ('name = "A"\nsystem_prompt = "x"\ncolour = "red"\n', "colour", "unknown key"),
    ('name = "A"\nsystem_prompt = "x"\n[sampling]\ntemperature = 9.0\n', "sampling.temperature", "[0, 5]"),
    ('name = "A"\nsystem_prompt = "x"\n[sampling]\ntop_p = 0\n', "sampling.top_p", "(0, 1]"),
    ('name = "A"\nsystem_prompt = "x"\n[sampling]\nmax_tokens = "many"\n', "sampling.max_tokens", "must be int"),
    ('name = "A"\nsystem_prompt = "x"\n[voice]\nbackend = "alexa"\n', "voice.backend", "must be one of"),
    ('name = "A"\nsystem_prompt = "x"\n[voice]\nspeaking_rate = 3.0\n', "voice.speaking_rate", "[0.5, 2.0]"),
    ('name = "A"\nsystem_prompt = "x"\n[endpointing]\nsilence_ms = 10\n', "endpointing.silence_ms", "[100, 3000]"),
    ('name = "A"\nsystem_prompt = "x"\nlanguage = "english"\n', "language", "ISO 639"),
    ('name = "A"\nsystem_prompt = "x"\n[speech]\nrules = "be brief"\n', "speech.rules", "must be a list"),
    ('name = "A"\nsystem_prompt = """unterminated\n', "", "not valid TOML"),
])
def test_each_kind_of_invalid_file_names_key(tmp_path, text, key, words):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SchemaError) as caught:
        load_persona(path)
    assert str(path) in str(caught.value)
    problems = caught.value.problems
    if key == "name":  # a missing required field is reported by the dataclass itself
        assert "name" in str(caught.value)
    else:
        assert any(k == key and words in m for k, m in problems), problems


def test_hot_reload_takes_effect_and_a_broken_edit_keeps_the_last_good(tmp_path):
    path = tmp_path / "tester.toml"
    path.write_text(VALID)
    store = PersonaStore([tmp_path])
    assert store.get("tester").sampling.temperature == 0.2

    path.write_text(VALID.replace("0.2", "0.9"))
    _touch_later(path)
    assert store.get("tester").sampling.temperature == 0.9
    assert store.errors() == {}

    path.write_text(VALID.replace("temperature = 0.2", "temperature = 99"))
    _touch_later(path)
    assert store.get("tester").sampling.temperature == 0.9  # the last good version
    assert "sampling.temperature" in store.errors()["tester"]

    path.write_text(VALID.replace("0.2", "0.4"))
    _touch_later(path)
    assert store.get("tester").sampling.temperature == 0.4
    assert store.errors() == {}


def test_user_directory_overrides_and_adds(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "nova.toml").write_text(VALID.replace("Tester", "My Nova"))
    (user / "extra.toml").write_text(VALID.replace("Tester", "Extra"))
    store = PersonaStore([SHIPPED_DIR, user])
    assert store.get("nova").name == "My Nova"
    assert store.get("extra").name == "Extra"
    assert store.get("professor").name == "Professor"  # shipped ones remain


def test_unknown_and_never_valid_personas_raise_clear_errors(tmp_path):
    (tmp_path / "broken.toml").write_text("name = 1\n")
    store = PersonaStore([tmp_path])
    with pytest.raises(PersonaNotFound, match="no persona named 'ghost'"):
        store.get("ghost")
    with pytest.raises(PersonaNotFound, match="invalid and has no earlier good version"):
        store.get("broken")


def test_deleted_file_disappears(tmp_path):
    shutil.copy(SHIPPED_DIR / "nova.toml", tmp_path / "nova.toml")
    store = PersonaStore([tmp_path])
    assert store.names() == ["nova"]
    (tmp_path / "nova.toml").unlink()
    with pytest.raises(PersonaNotFound):
        store.get("nova")
