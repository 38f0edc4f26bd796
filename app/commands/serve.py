"""``voxlane serve``: the web page, the WebSocket protocol, /v1, /metrics and /healthz on one port."""
from __future__ import annotations

import dataclasses
import logging
import os
import sys

from app.commands.common import CommandError, config_from
from app.config import LLM_BACKENDS
from pipeline.schema import SchemaError


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve the web app, the WebSocket API (/ws), /v1 and /healthz on one port")
    p.add_argument("--host", help="address to listen on (default: the config's server.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default: the config's server.port, 7860)")
    p.add_argument("--backend", choices=LLM_BACKENDS, help="LLM backend (default: the config's llm.backend)")
    p.add_argument("--no-ui", action="store_true", help="only /ws and /healthz, no Gradio page")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.add_argument("--log-json", action="store_true",
                   help="log one JSON object per line (default: key=value lines); both carry the session id")


def run(args) -> int:
    from app.malloc_arenas import limit_malloc_arenas

    limit_malloc_arenas()  # before any thread starts: memory stays flat as sessions come and go
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models come from the model store, never the hub at run time
    config = config_from(args)
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if overrides:
        try:
            config = dataclasses.replace(config, server=dataclasses.replace(config.server, **overrides))
        except (SchemaError, ValueError) as error:
            raise CommandError(f"invalid --host/--port: {error}") from error
    from app.logs import setup_logging
    from app.startup_phases import StartupPhases, seconds_since_process_start

    setup_logging(args.log_level, as_json=args.log_json)
    phases = StartupPhases()  # --log-level debug prints each phase ("startup: ..."); voxlane bench startup reads them
    phases.record("interpreter and command line", seconds_since_process_start())

    with phases.phase("imports"):
        from concurrent.futures import ThreadPoolExecutor

        from app.parallel_load import ModelLoadError
        from app.pipeline_sessions import PipelineSessions
        from app.server.app import build_page, create_app
        from app.server.runner import bind_socket

    server = config.server
    try:  # bound now (port 0: the kernel picks one), so the address is known and a busy port fails at once
        sock = bind_socket(server.host, server.port)
    except OSError as error:
        raise CommandError(f"cannot listen on {server.host}:{server.port}: {error}") from error
    url = f"http://{server.host}:{sock.getsockname()[1]}"
    print(f"voxlane: loading and warming up models ({config.models.asr}, {config.models.llm}, {config.models.tts}) "
          f"for {url} …", file=sys.stderr, flush=True)
    with ThreadPoolExecutor(1, thread_name_prefix="voxlane-page") as pool:
        def timed_page():
            with phases.phase("page"):
                return build_page(config)

        page = pool.submit(timed_page) if not args.no_ui else None  # Gradio needs no model: built meanwhile
        try:  # every model loads (in parallel) and runs once before the server says it is serving
            factory = PipelineSessions(config, args.backend, warm=True, phases=phases)
        except ModelLoadError as error:
            sock.close()
            raise CommandError(str(error)) from error
        try:
            blocks = page.result() if page is not None else None
        except BaseException:
            sock.close()
            factory.close()
            raise
    from app.openai_api import openai_router

    # The same loaded LLM also answers OpenAI-compatible clients on /v1 (same port, same token).
    with phases.phase("app"):
        app = create_app(config, factory, with_ui=not args.no_ui, page=blocks,
                         routers=(openai_router(factory.llm, config.models.llm, config.server.max_api_requests),))
    phases.record("serving since the process started", seconds_since_process_start())
    logging.getLogger("voxlane.startup").info("started in %.2f s: %s", phases.seconds["serving since the process started"],
                                              phases.summary())
    print(f"voxlane: serving on {url}  (WebSocket: {url.replace('http', 'ws', 1)}/ws, "
          f"OpenAI-compatible: {url}/v1, metrics: /metrics)", file=sys.stderr, flush=True)
    import uvicorn

    from app.server.connections import uvicorn_config

    freeze_warm_heap()
    try:
        # log_config=None: uvicorn's own loggers go through the structured handler too.
        uvicorn.Server(uvicorn_config(app, server, server.host, sock.getsockname()[1], log_level=args.log_level,
                                      log_config=None)).run(sockets=[sock])
    finally:
        sock.close()
        factory.close()
    return 0


def freeze_warm_heap() -> None:
    """Moves every object alive after warm-up (models, tokenizers, modules: millions of them) out
    of the garbage collector's reach: a full collection then scans only what requests allocate,
    instead of pausing the event loop for the whole heap (measured in docs/operations.md)."""
    import gc

    gc.collect()
    gc.freeze()
