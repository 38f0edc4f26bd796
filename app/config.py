"""The app config: one TOML file (``voxlane.toml``), every key with a default, environment
variables on top (``VOXLANE_<SECTION>_<KEY>``, e.g. ``VOXLANE_SERVER_PORT=8000``).

Each room owns its settings dataclass; ``AppConfig`` only composes them. Invalid settings raise
``SchemaError`` naming the file (or variable), the key and the problem; the app refuses to start.
"""
from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from app.model_store import PACKAGED, is_hub_name
from engine.config import EngineConfig
from pipeline.config import PipelineConfig
from pipeline.schema import SchemaError, build, check

LLM_BACKENDS = ("engine", "transformers", "openai")
MODEL_KINDS = ("asr", "llm", "tts", "vad", "turn")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
MIN_TOKEN_CHARS = 16  # a guessable token is no gate


@dataclass(frozen=True)
class ServerConfig:
    """Where and how ``voxlane serve`` listens, and its limits (the threat model: docs/operations.md)."""

    host: str = "127.0.0.1"  # loopback only by default; anything else requires access_token
    port: int = 7860  # 0: any free port (voxlane serve prints the one it got)
    max_sessions: int = 8  # started /ws sessions (counted from "start" on)
    max_connections: int = 128  # open connections of every kind (HTTP, WebSocket); more are closed at once
    max_pending_sockets: int = 16  # /ws sockets that have not sent "start" yet; more get "busy"
    max_pending_per_client: int = 8  # the same, per client address
    max_message_bytes: int = 1 << 20  # one WebSocket message after "start" (an audio frame)
    max_body_bytes: int = 1 << 20  # one HTTP request body; more get 413 before any route reads it
    header_timeout_s: float = 10.0  # a connection must send a request's headers within this
    body_timeout_s: float = 30.0  # and its whole body within this (408)
    access_token: str = ""  # required from clients when set; must be set when host is not loopback
    allowed_hosts: tuple[str, ...] = ()  # Host names accepted besides the bound address (DNS rebinding)
    allowed_origins: tuple[str, ...] = ()  # extra browser Origins allowed besides the server's own
    start_timeout_s: float = 5.0  # a socket must send "start" within this
    stall_timeout_s: float = 20.0  # a turn whose pipeline produces nothing for this long ends with "timeout"
    send_timeout_s: float = 10.0  # a client that reads nothing for this long is dropped ("slow_client")
    max_session_s: float = 4 * 3600.0  # a session lasts at most this long ("session_expired")
    max_messages_per_s: float = 50.0  # JSON messages per session and second (bursts of twice that)
    max_audio_speed: float = 4.0  # audio seconds per second a session may send (bursts of 60 s)
    max_api_requests: int = 4  # /v1 requests in flight; more get 429 (the engine's other slots stay for voice)

    def __post_init__(self) -> None:
        check(0 <= self.port <= 65535, "port", f"must be in [0, 65535] (0: any free port), got {self.port}")
        check(1 <= self.max_sessions <= 1024, "max_sessions", f"must be in [1, 1024], got {self.max_sessions}")
        check(self.max_sessions <= self.max_connections <= 65536, "max_connections",
              f"must be in [max_sessions ({self.max_sessions}), 65536], got {self.max_connections}")
        check(1 <= self.max_pending_sockets <= self.max_connections, "max_pending_sockets",
              f"must be in [1, max_connections ({self.max_connections})], got {self.max_pending_sockets}")
        check(1 <= self.max_pending_per_client <= self.max_pending_sockets, "max_pending_per_client",
              f"must be in [1, max_pending_sockets ({self.max_pending_sockets})], got {self.max_pending_per_client}")
        check(1 <= self.max_api_requests <= 1024, "max_api_requests",
              f"must be in [1, 1024], got {self.max_api_requests}")
        for name in ("max_message_bytes", "max_body_bytes"):
            value = getattr(self, name)
            check(1024 <= value <= 64 << 20, name, f"must be in [1024, 64 MiB], got {value}")
        for name, low, high in (("start_timeout_s", 1, 3600), ("stall_timeout_s", 0.1, 3600),
                                ("send_timeout_s", 0.1, 3600), ("max_session_s", 1, 7 * 86400),
                                ("header_timeout_s", 0.5, 600), ("body_timeout_s", 0.5, 3600),
                                ("max_messages_per_s", 1, 100_000), ("max_audio_speed", 1, 1000)):
            value = getattr(self, name)
            check(low <= value <= high, name, f"must be in [{low}, {high}], got {value}")
        check(self.host in LOOPBACK or bool(self.access_token), "access_token",
              f"must be set when host is {self.host!r} (not loopback): anyone on the network could talk to it")
        check(not self.access_token or (len(self.access_token) >= MIN_TOKEN_CHARS and self.access_token.isprintable()
                                        and self.access_token.strip() == self.access_token),
              "access_token", f"must be at least {MIN_TOKEN_CHARS} printable characters without surrounding spaces "
                              "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(24))'`)")
        for origin in self.allowed_origins:
            parts = urlsplit(origin)
            check(parts.scheme in ("http", "https") and bool(parts.netloc) and parts.path in ("", "/")
                  and not parts.query, "allowed_origins", f"{origin!r} is not an origin (scheme://host[:port])")


def _check_model(field_name: str, spec: str, kind: str) -> None:
    packaged = PACKAGED.get(spec)
    if packaged is not None:
        check(packaged.kind == kind, field_name, f"{spec!r} is a {packaged.kind} model, not a {kind} model")
    else:
        check(is_hub_name(spec) or Path(spec).expanduser().exists(), field_name,
              f"{spec!r} is not a packaged model ({', '.join(n for n, m in PACKAGED.items() if m.kind == kind)}), "
              "an existing path, or a hub name (owner/name)")


@dataclass(frozen=True)
class ModelsConfig:
    """Which model each part uses: a packaged name, a local path, or a hub name (needs internet)."""

    asr: str = "whisper-base"
    llm: str = "smollm2-135m-instruct"
    tts: str = "piper-en_US-joe-medium"
    vad: str = "silero-vad"
    turn: str = "smart-turn-v3.2"  # the end-of-turn model on the audio (persona endpointing mode "semantic")

    def __post_init__(self) -> None:
        for kind in MODEL_KINDS:
            _check_model(kind, getattr(self, kind), kind)


@dataclass(frozen=True)
class LLMConfig:
    """Which backend generates text: our engine (default), transformers (reference), or a remote
    OpenAI-compatible server (vLLM, llama.cpp server, Ollama) for scale-out."""

    backend: str = "engine"
    base_url: str = ""  # for backend = "openai", e.g. http://127.0.0.1:8000/v1
    remote_model: str = ""
    api_key: str = ""
    timeout_s: float = 30.0
    max_retries: int = 3  # before the first token only: a retry after speech would repeat it
    remote_context_length: int = 8192  # the remote model's context, for trimming history

    def __post_init__(self) -> None:
        check(self.backend in LLM_BACKENDS, "backend", f"must be one of {', '.join(LLM_BACKENDS)}, got {self.backend!r}")
        check(self.backend != "openai" or self.base_url.startswith(("http://", "https://")), "base_url",
              "must be an http(s) URL when backend is 'openai'")
        check(0 < self.timeout_s <= 600, "timeout_s", f"must be in (0, 600], got {self.timeout_s}")
        check(0 <= self.max_retries <= 10, "max_retries", f"must be in [0, 10], got {self.max_retries}")
        check(512 <= self.remote_context_length <= 1 << 20, "remote_context_length",
              f"must be in [512, 1048576], got {self.remote_context_length}")


@dataclass(frozen=True)
class PersonasConfig:
    """Where personas come from and which one a new session starts with."""

    default: str = "nova"
    user_dir: Path = Path("~/.config/voxlane/personas")  # files here override and add to the shipped ones


@dataclass(frozen=True)
class AppConfig:
    """Everything Voxlane reads from ``voxlane.toml``."""

    server: ServerConfig = field(default_factory=ServerConfig)
    models: ModelsConfig = field(default_factory=ModelsConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    personas: PersonasConfig = field(default_factory=PersonasConfig)
    source: str = "(defaults)"


def default_config_path() -> Path | None:
    """``$VOXLANE_CONFIG``, else ./voxlane.toml, else ~/.config/voxlane/voxlane.toml, if present."""
    if env := os.environ.get("VOXLANE_CONFIG"):
        return Path(env)
    for candidate in (Path("voxlane.toml"), Path.home() / ".config" / "voxlane" / "voxlane.toml"):
        if candidate.is_file():
            return candidate
    return None


def _parse_env_value(raw: str):
    """An environment value in TOML syntax (8000, true, ["a"]), or else a plain string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _env_overrides(environ: dict[str, str]) -> tuple[dict, list[str]]:
    sections = {f.name: f.type for f in dataclasses.fields(AppConfig) if f.name != "source"}
    data: dict[str, dict] = {}
    used = []
    for name, raw in environ.items():
        if not name.startswith("VOXLANE_") or name in ("VOXLANE_HOME", "VOXLANE_CONFIG"):
            continue
        rest = name[len("VOXLANE_"):].lower()
        section = next((s for s in sections if rest.startswith(s + "_")), None)
        if section is None:
            continue
        data.setdefault(section, {})[rest[len(section) + 1:]] = _parse_env_value(raw)
        used.append(name)
    return data, used


def load_config(path: str | Path | None = None, environ: dict[str, str] | None = None) -> AppConfig:
    """Read the config file (if any), apply ``VOXLANE_*`` variables, validate everything."""
    environ = dict(os.environ if environ is None else environ)
    path = Path(path) if path else default_config_path()
    data: dict = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as error:
            raise SchemaError(path, [("", "file not found")]) from error
        except tomllib.TOMLDecodeError as error:
            raise SchemaError(path, [("", f"not valid TOML: {error}")]) from error
    overrides, used = _env_overrides(environ)
    for section, values in overrides.items():
        target = data.setdefault(section, {})
        if isinstance(target, dict):
            target.update(values)
    source = str(path) if path else "(defaults)"
    if used:
        source += " + environment (" + ", ".join(sorted(used)) + ")"
    if "source" in data:
        raise SchemaError(source, [("source", "is set by the loader, not the file")])
    data["source"] = source
    return build(AppConfig, data, source)
