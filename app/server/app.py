"""The one ASGI app ``voxlane serve`` runs: ``/ws``, ``/healthz``, ``/metrics``, ``/static`` and the
Gradio page at ``/``, all on one port."""
from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, WebSocket
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from app.config import AppConfig
from app.metrics import CONTENT_TYPE, Metrics
from app.server import protocol
from app.server.access import is_token_valid
from app.server.conversation import ConversationFactory
from app.server.registry import SessionRegistry
from app.server.ws import SocketHandler

STATIC_DIR = Path(__file__).parent / "static"


def create_app(config: AppConfig, factory: ConversationFactory, with_ui: bool = True,
               routers: tuple[APIRouter, ...] = ()) -> FastAPI:
    """Routes declared before the Gradio mount win, so Gradio (at ``/``) never shadows them.
    ``routers`` (e.g. the OpenAI-compatible ``/v1``) need the access token when one is set."""
    app = FastAPI(title="Voxlane", docs_url=None, redoc_url=None, openapi_url=None)
    registry = SessionRegistry(config.server.max_sessions, config.server.max_connections)
    app.state.registry = registry
    app.state.factory = factory
    metrics = Metrics(engine_stats=engine_stats_of(factory))
    app.state.metrics = metrics

    @app.get("/healthz")
    def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok", "protocol": protocol.VERSION,
                             "sessions": registry.num_open, "max_sessions": registry.max_sessions,
                             "personas": factory.persona_names()})

    @app.websocket("/ws")
    async def websocket(ws: WebSocket) -> None:
        await SocketHandler(ws, config.server, factory, registry, metrics).run()

    def require_token(request: Request) -> None:
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not is_token_valid(given, config.server):
            raise HTTPException(status_code=401, detail="a valid access token is required (Authorization: Bearer)")

    @app.get("/metrics", dependencies=[Depends(require_token)])
    def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    for router in routers:
        app.include_router(router, dependencies=[Depends(require_token)])
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    if with_ui:
        import gradio as gr

        from app.commands.common import persona_store
        from app.server.ui import HEAD, _theme, build_ui

        blocks = build_ui(persona_store(config), factory.default_persona())
        # ssr_mode=False: server-side rendering would need a Node server; the page is static anyway.
        app = gr.mount_gradio_app(app, blocks, path="/", ssr_mode=False, head=HEAD, theme=_theme(),
                                  footer_links=[])
    return app


def engine_stats_of(factory: ConversationFactory):
    """The LLM backend's queue and KV-slot figures for /metrics, when it has any (our engine)."""
    stats = getattr(getattr(factory, "llm", None), "stats", None)
    if stats is None:
        return None

    def read() -> dict:
        s = stats()
        return {"queue_depth": s.waiting, "slots_in_use": s.slots_busy, "slots_held": s.slots_held,
                "num_slots": s.num_slots, "tokens_per_s": s.tokens_per_s}

    return read
