"""The WebSocket protocol's messages (version 1): parsing what clients send, building what the
server sends. Pure functions and dataclasses, no I/O, so every rule is testable on its own.

See docs/protocol.md for the reference a client author reads.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

VERSION = 1
MIN_INPUT_RATE_HZ = 8000
MAX_INPUT_RATE_HZ = 192000
MAX_TEXT_CHARS = 4000
# Text frames are refused by size before they are parsed (parsing runs on the event loop). Before
# "start" a socket has not shown the token yet: a start message is a few hundred bytes. After it,
# the largest text turn is 4,000 characters, each at most 12 bytes as JSON ("\ud83d\ude00").
MAX_START_BYTES = 4096
MAX_TEXT_FRAME_BYTES = 64 * 1024


class ErrorCode:
    """Every error code a server may send. ``fatal`` errors are followed by a close."""

    BAD_JSON = "bad_json"  # a text message that is not a JSON object
    BAD_MESSAGE = "bad_message"  # unknown type, missing or invalid field
    NOT_STARTED = "not_started"  # anything but "start" before "start"
    ALREADY_STARTED = "already_started"
    UNSUPPORTED_VERSION = "unsupported_version"  # fatal
    UNAUTHORIZED = "unauthorized"  # fatal: the server has an access token and it was not given
    FORBIDDEN_ORIGIN = "forbidden_origin"  # fatal: a browser page from another site
    FORBIDDEN_HOST = "forbidden_host"  # fatal: a Host header that names another server (DNS rebinding)
    BUSY = "busy"  # fatal: max_sessions conversations are already open
    TOO_LARGE = "message_too_large"  # fatal: a message above max_message_bytes
    BAD_AUDIO = "bad_audio"  # a binary frame that is not whole PCM16 samples
    UNKNOWN_PERSONA = "unknown_persona"
    PIPELINE = "pipeline_error"  # a stage failed on one turn; the next turn works
    TIMEOUT = "timeout"  # a stage stalled past server.stall_timeout_s: the turn ended with an apology
    RATE_LIMITED = "rate_limited"  # messages or audio faster than the session's limits: dropped
    SLOW_CLIENT = "slow_client"  # fatal: the client read nothing for server.send_timeout_s
    SESSION_EXPIRED = "session_expired"  # fatal: the session lasted server.max_session_s
    INTERNAL = "internal"  # fatal: a server bug


# WebSocket close codes (RFC 6455 and the registered 4000-4999 private range) per fatal error.
CLOSE_CODES = {
    ErrorCode.UNSUPPORTED_VERSION: 4000,
    ErrorCode.UNAUTHORIZED: 4001,
    ErrorCode.FORBIDDEN_ORIGIN: 4003,
    ErrorCode.FORBIDDEN_HOST: 4003,
    ErrorCode.BUSY: 1013,  # "try again later"
    ErrorCode.TOO_LARGE: 1009,  # "message too big"
    ErrorCode.INTERNAL: 1011,
    ErrorCode.SLOW_CLIENT: 1008,  # "policy violation"
    ErrorCode.SESSION_EXPIRED: 1001,  # "going away"
}


class ProtocolError(Exception):
    """A message the server refuses; carries the code sent back to the client."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def is_fatal(self) -> bool:
        return self.code in CLOSE_CODES


@dataclass(frozen=True)
class Start:
    """Opens the session: which persona, and the sample rate of the PCM16 frames that follow."""

    sample_rate: int
    persona: str | None = None
    token: str = ""
    version: int = VERSION


@dataclass(frozen=True)
class TextInput:
    """A typed user turn; interrupts the assistant if it is speaking."""

    text: str


@dataclass(frozen=True)
class Interrupt:
    """Stop the assistant now (audio and generation)."""


@dataclass(frozen=True)
class SetPersona:
    """Talk as another persona from the next turn on."""

    persona: str


@dataclass(frozen=True)
class Played:
    """Playback progress: the client has played ``samples`` samples of turn ``gen``'s audio, so the
    history can record what the user actually heard when they interrupt."""

    gen: int
    samples: int


@dataclass(frozen=True)
class End:
    """Close the session cleanly."""


ClientMessage = Start | TextInput | Interrupt | SetPersona | Played | End


def _is_encodable(text: str) -> bool:
    """JSON may spell a lone surrogate ("\\ud800"), which no UTF-8 text (an answer, a log) can carry."""
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _field(data: dict, name: str, kind: type, required: bool = True, default: Any = None):
    if name not in data:
        if required:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f"'{data.get('type')}' needs the field '{name}'")
        return default
    value = data[name]
    if isinstance(value, str) and not _is_encodable(value):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"'{name}' holds an unpaired UTF-16 surrogate (\\ud800-\\udfff)")
    # bool is an int in Python; a JSON true is never a valid number here
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"'{name}' has the wrong type ({type(value).__name__})")
    return value


def parse_client_text(text: str) -> ClientMessage:
    """One client text message -> a message object; raises ProtocolError with a code."""
    try:
        data = json.loads(text)
    except RecursionError:  # [[[[...]]]] nested deeper than the parser's stack
        raise ProtocolError(ErrorCode.BAD_JSON, "JSON nested too deeply") from None
    except ValueError as error:  # JSONDecodeError, and what the parser refuses (an int of 4,300+ digits)
        raise ProtocolError(ErrorCode.BAD_JSON, f"not JSON this server reads: {str(error)[:200]}") from None
    if not isinstance(data, dict):
        raise ProtocolError(ErrorCode.BAD_JSON, "a message must be a JSON object")
    kind = data.get("type")
    if kind == "start":
        version = _field(data, "version", int, required=False, default=VERSION)
        if version != VERSION:
            raise ProtocolError(ErrorCode.UNSUPPORTED_VERSION,
                                f"protocol version {version} is not supported; this server speaks {VERSION}")
        rate = _field(data, "sample_rate", int)
        if not MIN_INPUT_RATE_HZ <= rate <= MAX_INPUT_RATE_HZ:
            raise ProtocolError(ErrorCode.BAD_MESSAGE,
                                f"sample_rate must be in [{MIN_INPUT_RATE_HZ}, {MAX_INPUT_RATE_HZ}] Hz, got {rate}")
        fmt = _field(data, "format", str, required=False, default="pcm16")
        if fmt != "pcm16":
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f"format must be 'pcm16', got {fmt!r}")
        return Start(sample_rate=rate, persona=_field(data, "persona", str, required=False),
                     token=_field(data, "token", str, required=False, default=""), version=version)
    if kind == "text":
        text_value = _field(data, "text", str).strip()
        if not text_value or len(text_value) > MAX_TEXT_CHARS:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f"text must be 1 to {MAX_TEXT_CHARS} characters")
        return TextInput(text_value)
    if kind == "interrupt":
        return Interrupt()
    if kind == "persona":
        return SetPersona(_field(data, "persona", str))
    if kind == "played":
        gen, samples = _field(data, "gen", int), _field(data, "samples", int)
        if gen < 0 or samples < 0:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "gen and samples must be >= 0")
        return Played(gen, samples)
    if kind == "end":
        return End()
    raise ProtocolError(ErrorCode.BAD_MESSAGE, f"unknown message type {kind!r}")


def check_audio_frame(data: bytes) -> None:
    """A binary client frame must hold whole little-endian int16 samples."""
    if len(data) % 2:
        raise ProtocolError(ErrorCode.BAD_AUDIO, f"a PCM16 frame has an even number of bytes, got {len(data)}")


def error_message(code: str, message: str) -> dict:
    return {"type": "error", "code": code, "message": message, "fatal": code in CLOSE_CODES}


def encode(message: dict) -> str:
    """Server messages are compact JSON text frames."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False)
