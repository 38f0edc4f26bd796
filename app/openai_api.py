"""An OpenAI-compatible API on the local LLM backend: ``POST /v1/chat/completions`` (streaming SSE
or not) and ``GET /v1/models``, so any OpenAI client can use Voxlane's engine.

Admission control: at most ``max_requests`` requests in flight (more get 429 with Retry-After),
so /v1 clients cannot take every engine slot from voice sessions. Every blocking call (parsing,
tokenizing, waiting for the next delta) runs on this router's own pool of ``max_requests``
threads, never on the event loop's shared default pool that sessions need to open. A client
that goes away, streaming or not, cancels its completion at once. Prompts are checked in
characters before they are tokenized and in tokens before they reach the engine (400); a
client sees a clear message, the details go to the log.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from app.openai_schema import ChatRequest, RequestError, parse_request
from engine.backends.base import Completion, LLMBackend

log = logging.getLogger(__name__)

CHARS_PER_CONTEXT_TOKEN = 16  # a prompt longer than this many characters per context token cannot fit
RETRY_AFTER_S = 1
_END = object()


class Admission:
    """Requests in flight (the event loop only touches it)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.in_flight = 0

    def try_enter(self) -> bool:
        if self.in_flight >= self.limit:
            return False
        self.in_flight += 1
        return True

    def leave(self) -> None:
        self.in_flight -= 1


class _AdmittedStream(StreamingResponse):
    """Gives the request's place back and cancels its completion however the stream ends: done,
    failed, or the client gone (even before the first byte was sent)."""

    def __init__(self, content, release, **kwargs):
        super().__init__(content, **kwargs)
        self._release = release

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def _error(error: RequestError) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if error.status == 429 else None
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def _finish_reason(completion: Completion) -> str:
    """"length" when max_tokens (or the context) ended the answer, else "stop"."""
    return "length" if getattr(completion, "finish_reason", None) == "length" else "stop"


def _chunk(completion_id: str, model: str, created: int, delta: dict, finish: str | None = None) -> str:
    body = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(body)}\n\n"


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def openai_router(backend: LLMBackend, model_name: str, max_requests: int = 4) -> APIRouter:
    """Routes for ``/v1``; ``model_name`` is what ``/v1/models`` lists (requests may name any model)."""
    router = APIRouter(prefix="/v1")
    admission = Admission(max_requests)
    pool = ThreadPoolExecutor(max_workers=max_requests, thread_name_prefix="voxlane-v1")

    async def off_loop(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    @router.get("/models")
    async def list_models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "voxlane",
                                            "created": 0}]}

    async def start(request: Request) -> tuple[ChatRequest, list[dict], int, Completion]:
        """Checks the request and starts its completion; RequestError says what is wrong."""
        body = await off_loop(parse_request, await request.body(), request.headers.get("content-type"))
        messages = [m.model_dump() for m in body.messages]
        context = backend.context_length
        if body.num_chars > CHARS_PER_CONTEXT_TOKEN * context:
            raise RequestError(f"messages: {body.num_chars} characters cannot fit this model's context of {context} "
                               "tokens", param="messages", code="context_length_exceeded")
        prompt_tokens = await off_loop(backend.count_tokens, messages)
        if prompt_tokens >= context:
            raise RequestError(f"messages: the prompt is {prompt_tokens} tokens; this model's context holds {context}",
                               param="messages", code="context_length_exceeded")
        sampling = body.sampling(max_tokens_cap=context - prompt_tokens)  # the answer ends at the context
        try:
            completion = await off_loop(backend.generate, messages, sampling, None)
        except ValueError as error:  # the backend's own check (e.g. its tokenizer counted otherwise)
            log.warning("/v1 request refused by the backend: %s", error)
            raise RequestError("messages: the prompt does not fit this model's context", param="messages",
                               code="context_length_exceeded") from None
        return body, messages, prompt_tokens, completion

    @router.post("/chat/completions")
    async def chat_completions(request: Request):
        if not admission.try_enter():
            return _error(RequestError(f"{admission.limit} requests are in flight (server.max_api_requests); "
                                       f"retry after {RETRY_AFTER_S} s", status=429, code="rate_limited"))
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                admission.leave()

        try:
            body, messages, prompt_tokens, completion = await start(request)
        except RequestError as error:
            release()
            return _error(error)
        except Exception:
            release()
            log.exception("/v1 request failed before generating")
            return _error(RequestError("internal error (logged)", status=500, code="internal"))
        completion_id, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        if body.stream:
            def end() -> None:
                completion.cancel()
                release()

            return _AdmittedStream(_events(completion, completion_id, created), end,
                                   media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        try:
            return await _complete(request, completion, messages, prompt_tokens, completion_id, created)
        finally:
            completion.cancel()
            release()

    async def _events(completion: Completion, completion_id: str, created: int) -> AsyncIterator[str]:
        yield _chunk(completion_id, model_name, created, {"role": "assistant", "content": ""})
        iterator = iter(completion)
        try:
            while (delta := await off_loop(next, iterator, _END)) is not _END:
                yield _chunk(completion_id, model_name, created, {"content": delta})
        except Exception:
            log.exception("/v1 stream %s failed", completion_id)
            yield f"data: {json.dumps({'error': {'message': 'the completion failed (logged)', 'code': 'internal'}})}\n\n"
            return
        yield _chunk(completion_id, model_name, created, {}, _finish_reason(completion))
        yield "data: [DONE]\n\n"

    async def _complete(request: Request, completion: Completion, messages: list[dict], prompt_tokens: int,
                        completion_id: str, created: int) -> Response:
        """The whole answer, unless the client leaves first: then the completion is cancelled."""
        answer = asyncio.ensure_future(off_loop(lambda: "".join(completion)))
        gone = asyncio.ensure_future(_until_disconnect(request))
        await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if not answer.done():
            completion.cancel()
            log.info("/v1 client left; completion %s cancelled", completion_id)
            return Response(status_code=499)  # nobody reads it
        try:
            text = answer.result()
        except Exception:
            log.exception("/v1 completion %s failed", completion_id)
            return _error(RequestError("the completion failed (logged)", status=500, code="internal"))
        total = await off_loop(backend.count_tokens, messages + [{"role": "assistant", "content": text}])
        completion_tokens = max(0, total - prompt_tokens)
        return JSONResponse({
            "id": completion_id, "object": "chat.completion", "created": created, "model": model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": _finish_reason(completion)}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        })

    return router
