"""A process that serves Voxlane's OpenAI-compatible API on a backend, for tests:
``python -m tests.app.openai_server PORT BACKEND`` (PORT 0: any free port). Prints the port it
listens on as its first line of output."""
from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import uvicorn
from fastapi import FastAPI

from app.backends import make_llm_backend
from app.config import load_config
from app.openai_api import openai_router
from app.server.runner import bind_socket

if __name__ == "__main__":
    port, backend_name = int(sys.argv[1]), sys.argv[2]
    config = load_config(environ={})
    app = FastAPI()
    app.include_router(openai_router(make_llm_backend(config, backend_name), config.models.llm))
    sock = bind_socket("127.0.0.1", port)
    print(sock.getsockname()[1], flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
