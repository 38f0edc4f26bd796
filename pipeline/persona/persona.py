"""A persona: who Voxlane talks as. One TOML file each (assets/personas/*.toml, or the user's
persona directory); see assets/personas/README.md for every key."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from engine.sampling_params import SamplingParams
from pipeline.schema import SchemaError, build, check

TTS_BACKENDS = ("piper", "coqui", "espeak", "flite")
ENDPOINTING_MODES = ("semantic", "silence")


@dataclass(frozen=True)
class Voice:
    """How the persona sounds."""

    backend: str = "piper"
    voice: str = "piper-en_US-joe-medium"  # a packaged/hub/local model for piper and coqui; a voice name for espeak/flite
    speaking_rate: float = 1.0  # 1.0 = the voice's natural pace; 1.2 = 20 % faster
    # How much each reading of the same text varies (Piper samples noise per synthesis; this scales
    # it): 1.0 = the voice's own, 0 = the same audio every time, flatter. Piper only.
    variation: float = 1.0

    def __post_init__(self) -> None:
        check(self.backend in TTS_BACKENDS, "backend", f"must be one of {', '.join(TTS_BACKENDS)}, got {self.backend!r}")
        check(bool(self.voice.strip()), "voice", "must not be empty")
        check(0.5 <= self.speaking_rate <= 2.0, "speaking_rate", f"must be in [0.5, 2.0], got {self.speaking_rate}")
        check(0.0 <= self.variation <= 1.5, "variation", f"must be in [0, 1.5], got {self.variation}")


@dataclass(frozen=True)
class Endpointing:
    """When the user's turn is over.

    "semantic": at each pause the voice (Smart Turn) and the words (the LLM's sentence-end
    probability) are read; a finished sentence ends the turn after ``short_silence_ms``, an
    unfinished one waits up to ``long_silence_ms``. "silence": ``silence_ms`` of silence, always.
    Silences count from the VAD's last voiced frame."""

    mode: str = "semantic"
    silence_ms: int = 500  # "silence": trailing silence that ends a turn
    min_speech_ms: int = 250  # shorter bursts (a cough, a click) are not a turn and do not barge in
    short_silence_ms: int = 200  # "semantic": silence that ends a turn judged finished
    long_silence_ms: int = 1600  # "semantic": the most a turn judged unfinished waits before it ends anyway
    threshold: float = 0.5  # "semantic": P(turn complete) from which the turn is judged finished
    is_last_word_checked: bool = True  # "semantic": a last word with no voice under it cannot finish a sentence

    def __post_init__(self) -> None:
        check(self.mode in ENDPOINTING_MODES, "mode", f"must be one of {', '.join(ENDPOINTING_MODES)}, got {self.mode!r}")
        check(100 <= self.silence_ms <= 3000, "silence_ms", f"must be in [100, 3000], got {self.silence_ms}")
        check(50 <= self.min_speech_ms <= 2000, "min_speech_ms", f"must be in [50, 2000], got {self.min_speech_ms}")
        check(64 <= self.short_silence_ms <= 2000, "short_silence_ms",
              f"must be in [64, 2000], got {self.short_silence_ms}")
        check(self.short_silence_ms <= self.long_silence_ms <= 5000, "long_silence_ms",
              f"must be in [short_silence_ms ({self.short_silence_ms}), 5000], got {self.long_silence_ms}")
        check(0.0 < self.threshold < 1.0, "threshold", f"must be in (0, 1), got {self.threshold}")


@dataclass(frozen=True)
class SpeechRules:
    """What makes text speakable: rules told to the model, and what the chunker strips before TTS."""

    rules: tuple[str, ...] = (
        "Answer in one to three short spoken sentences.",
        "Never use lists, markdown, code, emoji or URLs.",
    )
    strip_markdown: bool = True
    strip_emoji: bool = True
    strip_urls: bool = True


@dataclass(frozen=True)
class Persona:
    """Everything about who the assistant is; loaded from one TOML file."""

    name: str
    system_prompt: str
    description: str = ""
    greeting: str = ""
    language: str = "en"
    voice: Voice = field(default_factory=Voice)
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.7, top_p=0.9, max_tokens=120))
    endpointing: Endpointing = field(default_factory=Endpointing)
    speech: SpeechRules = field(default_factory=SpeechRules)
    source: Path | None = None  # the file it came from

    def __post_init__(self) -> None:
        check(bool(self.name.strip()) and len(self.name) <= 64, "name", "must be 1 to 64 characters")
        check(bool(self.system_prompt.strip()), "system_prompt", "must not be empty")
        check(len(self.system_prompt) <= 8000, "system_prompt", "must be at most 8,000 characters")
        check(len(self.language) in (2, 3) and self.language.isalpha(), "language",
              f"must be an ISO 639 code such as 'en', got {self.language!r}")

    @property
    def key(self) -> str:
        """The name used to pick the persona: its file's stem."""
        return self.source.stem if self.source else self.name.lower()

    def full_system_prompt(self) -> str:
        """The system prompt with the speakable-output rules appended."""
        if not self.speech.rules:
            return self.system_prompt.strip()
        return self.system_prompt.strip() + "\n" + " ".join(self.speech.rules)


def load_persona(path: str | Path) -> Persona:
    """Parse and validate one persona file; raises SchemaError naming the file and key."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise SchemaError(path, [("", f"not valid TOML: {error}")]) from error
    except (OSError, UnicodeDecodeError) as error:
        raise SchemaError(path, [("", f"cannot read: {error}")]) from error
    if "source" in data:
        raise SchemaError(path, [("source", "is set by the loader, not the file")])
    data["source"] = str(path)
    return build(Persona, data, path)
