"""An OpenAI-compatible API on the local LLM backend: ``POST /v1/chat/completions`` (streaming SSE
or not) and ``GET /v1/models``, so any OpenAI client can use Voxlane's engine."""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import AsyncIterator, Literal

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field, field_validator

from engine.backends.base import Completion, LLMBackend
from engine.sampling_params import SamplingParams

MAX_MESSAGES = 256
MAX_CONTENT_CHARS = 100_000


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=MAX_CONTENT_CHARS)


class ChatRequest(BaseModel):
    """The subset of OpenAI's chat completion request that a local model can honour."""

    model: str = ""
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    stream: bool = False
    max_tokens: int | None = Field(default=None, ge=1, le=4096)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=4096)
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    repetition_penalty: float = Field(default=1.0, ge=0.5, le=2.0)
    seed: int | None = None
    stop: str | list[str] | None = None

    @field_validator("stop")
    @classmethod
    def _at_most_four_stops(cls, value):
        stops = [value] if isinstance(value, str) else (value or [])
        if len(stops) > 4:
            raise ValueError("at most 4 stop strings")
        return stops

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              repetition_penalty=self.repetition_penalty,
                              max_tokens=self.max_completion_tokens or self.max_tokens or 256,
                              seed=self.seed, stop=tuple(self.stop or ()))


def _chunk(completion_id: str, model: str, created: int, delta: dict, finish: str | None = None) -> str:
    body = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(body)}\n\n"


async def _deltas(completion: Completion) -> AsyncIterator[str]:
    """The backend's blocking iterator, one delta per worker-thread hop; cancelling the consumer
    (the client went away) cancels the completion and frees its engine slot."""
    iterator = iter(completion)
    sentinel = object()
    try:
        while (delta := await asyncio.to_thread(next, iterator, sentinel)) is not sentinel:
            yield delta
    finally:
        completion.cancel()


def openai_router(backend: LLMBackend, model_name: str) -> APIRouter:
    """Routes for ``/v1``; ``model_name`` is what ``/v1/models`` lists (requests may name any model)."""
    router = APIRouter(prefix="/v1")

    @router.get("/models")
    async def list_models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "voxlane",
                                            "created": 0}]}

    @router.post("/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        messages = [m.model_dump() for m in body.messages]
        try:
            sampling = body.sampling()
        except ValueError as error:
            raise HTTPException(status_code=400, detail=str(error)) from error
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        completion = await asyncio.to_thread(backend.generate, messages, sampling, None)
        if body.stream:
            async def events() -> AsyncIterator[str]:
                yield _chunk(completion_id, model_name, created, {"role": "assistant", "content": ""})
                async for delta in _deltas(completion):
                    yield _chunk(completion_id, model_name, created, {"content": delta})
                yield _chunk(completion_id, model_name, created, {}, "stop")
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        text = "".join([d async for d in _deltas(completion)])
        prompt_tokens = backend.count_tokens(messages)
        completion_tokens = backend.count_tokens(messages + [{"role": "assistant", "content": text}]) - prompt_tokens
        return JSONResponse({
            "id": completion_id, "object": "chat.completion", "created": created, "model": model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": max(0, completion_tokens),
                      "total_tokens": prompt_tokens + max(0, completion_tokens)},
        })

    return router
