"""The one ASGI app ``voxlane serve`` runs: ``/ws``, ``/healthz``, ``/metrics``, ``/static``, extra
routers (``/v1``) and the Gradio page at ``/``, all on one port, all behind one gate
(app/server/gate.py: Host, Origin and CORS, the access token, body size and time)."""
from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI, WebSocket
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from app.config import AppConfig
from app.metrics import CONTENT_TYPE, Metrics
from app.server import protocol
from app.server.gate import Gate
from app.server.registry import SessionRegistry
from app.server.voice_session import VoiceSessionFactory
from app.server.ws import SocketHandler

STATIC_DIR = Path(__file__).parent / "static"


def build_page(config: AppConfig):
    """The Gradio page (``gr.Blocks``): it needs only the config and the personas, not the models,
    so ``voxlane serve`` builds it while they load (importing Gradio alone takes seconds)."""
    from app.commands.common import persona_store
    from app.server.ui import build_ui

    return build_ui(persona_store(config), config.personas.default)


def create_app(config: AppConfig, factory: VoiceSessionFactory, with_ui: bool = True,
               routers: tuple[APIRouter, ...] = (), page=None) -> FastAPI:
    """Routes declared before the Gradio mount win, so Gradio (at ``/``) never shadows them. The
    gate in front of everything checks the access token, when one is set, for every route but
    ``/healthz`` (``/ws`` may carry it in its ``start`` message instead). ``page``: the page from
    ``build_page`` when built already (with ``with_ui``; else it is built here)."""
    app = FastAPI(title="Voxlane", docs_url=None, redoc_url=None, openapi_url=None)
    server = config.server
    registry = SessionRegistry(server.max_sessions, server.max_pending_sockets, server.max_pending_per_client)
    app.state.registry = registry
    app.state.server_config = config.server  # BackgroundServer reads the transport's bounds from here
    app.state.factory = factory
    metrics = Metrics(engine_stats=engine_stats_of(factory))
    app.state.metrics = metrics

    @app.get("/healthz")
    async def healthz() -> JSONResponse:  # on the loop, not the thread pool: it must answer under load
        return JSONResponse({"status": "ok", "protocol": protocol.VERSION,
                             "sessions": registry.num_open, "max_sessions": registry.max_sessions,
                             "personas": factory.persona_names()})

    @app.websocket("/ws")
    async def websocket(ws: WebSocket) -> None:
        await SocketHandler(ws, config.server, factory, registry, metrics).run()

    @app.get("/metrics")
    def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    for router in routers:
        app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    if with_ui:
        import gradio as gr

        from app.server.ui import HEAD, _theme

        blocks = page if page is not None else build_page(config)
        # ssr_mode=False: server-side rendering would need a Node server; the page is static anyway.
        # Uploads are capped like every body (the page itself uploads nothing).
        app = gr.mount_gradio_app(app, blocks, path="/", ssr_mode=False, head=HEAD, theme=_theme(),
                                  footer_links=[], max_file_size=config.server.max_body_bytes)
    app.add_middleware(Gate, config=config.server)  # outermost of the app's own layers: before any route
    return app


def engine_stats_of(factory: VoiceSessionFactory):
    """The LLM backend's queue and KV-slot figures for /metrics, when it has any (our engine)."""
    stats = getattr(getattr(factory, "llm", None), "stats", None)
    if stats is None:
        return None

    def read() -> dict:
        s = stats()
        return {"queue_depth": s.waiting, "slots_in_use": s.slots_busy, "slots_held": s.slots_held,
                "num_slots": s.num_slots, "tokens_per_s": s.tokens_per_s}

    return read
