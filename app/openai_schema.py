"""What ``POST /v1/chat/completions`` accepts, checked at the edge: every field's type and range,
fields a local model cannot honour refused unless they ask for nothing (``n: 1``), unknown
fields refused; each problem names its field (OpenAI's ``param``) and answers 400."""
from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from engine.sampling_params import MAX_SEED, MAX_STOP_CHARS, MAX_STOPS, SamplingParams

MAX_MESSAGES = 256
MAX_CONTENT_CHARS = 100_000
DEFAULT_MAX_TOKENS = 256


class RequestError(Exception):
    """A request the API refuses: ``status``, the field (``param``), a message for the client."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str = "invalid_request"):
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": "invalid_request_error", "param": self.param,
                          "code": self.code}}


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=MAX_CONTENT_CHARS)


class ChatRequest(BaseModel):
    """The subset of OpenAI's chat completion request that a local model can honour."""

    model_config = ConfigDict(extra="forbid")  # "tools", "functions", "logit_bias" ...: 400, never ignored

    model: str = Field(default="", max_length=256)
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    stream: bool = False
    max_tokens: int | None = Field(default=None, ge=1, le=4096)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=4096)
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, le=1_000_000)
    repetition_penalty: float = Field(default=1.0, ge=0.5, le=2.0)
    dry_multiplier: float = Field(default=0.0, ge=0.0, le=5.0)  # DRY, as llama.cpp's server names it
    dry_base: float = Field(default=1.75, ge=1.0, le=4.0)
    dry_allowed_length: int = Field(default=2, ge=1, le=32)
    seed: int | None = Field(default=None, ge=0, lt=MAX_SEED)
    stop: str | list[str] | None = None
    user: str | None = Field(default=None, max_length=256)  # OpenAI's end-user id: nothing to do with it
    # OpenAI fields a local model does not do: accepted only at the value that asks for nothing.
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: bool | None = None
    response_format: dict | None = None
    stream_options: dict | None = None

    @model_validator(mode="after")
    def _supported(self) -> "ChatRequest":
        for name, asks_nothing in (("n", self.n == 1), ("presence_penalty", self.presence_penalty == 0),
                                   ("frequency_penalty", self.frequency_penalty == 0), ("logprobs", not self.logprobs),
                                   ("response_format", self.response_format in (None, {"type": "text"})),
                                   ("stream_options", not self.stream_options
                                    or self.stream_options == {"include_usage": False})):
            if not asks_nothing:
                raise ValueError(f"{name}: not supported by this server")
        stops = self.stops
        if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"stop: at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters")
        return self

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def num_chars(self) -> int:
        return sum(len(m.content) for m in self.messages)

    def sampling(self, max_tokens_cap: int) -> SamplingParams:
        """The engine's settings; ``max_tokens_cap`` is what the context leaves after the prompt."""
        wanted = self.max_completion_tokens or self.max_tokens or DEFAULT_MAX_TOKENS
        try:
            return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                                  repetition_penalty=self.repetition_penalty, dry_multiplier=self.dry_multiplier,
                                  dry_base=self.dry_base, dry_allowed_length=self.dry_allowed_length,
                                  max_tokens=max(1, min(wanted, max_tokens_cap)),
                                  seed=self.seed, stop=tuple(self.stops))
        except ValueError as error:  # "field: message"
            field, _, message = str(error).partition(": ")
            raise RequestError(str(error), param=field if message else None) from None


def parse_request(body: bytes, content_type: str | None) -> ChatRequest:
    """Bytes of a request -> a checked ChatRequest, or RequestError naming what is wrong."""
    media = (content_type or "").split(";")[0].strip().lower()
    if not (media == "application/json" or (media.startswith("application/") and media.endswith("+json"))):
        # A browser page may send text/plain without a CORS preflight: never read it as JSON.
        raise RequestError("the body must be JSON sent as Content-Type: application/json", status=415,
                           code="unsupported_media_type")
    try:
        data = json.loads(body)
    except RecursionError:
        raise RequestError("the body is JSON nested too deeply", code="bad_json") from None
    except ValueError as error:  # not JSON, not UTF-8, or an integer of 4,300+ digits
        raise RequestError(f"the body is not JSON this server reads: {str(error)[:200]}", code="bad_json") from None
    if not isinstance(data, dict):
        raise RequestError("the body must be a JSON object")
    try:
        return ChatRequest.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            message = "not supported by this server"
        if param is None and ": " in message:  # a model-level check names its own field
            param, message = message.split(": ", 1)
        raise RequestError(f"{param}: {message}" if param else message, param=param) from None
