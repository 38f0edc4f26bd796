"""A process that serves Voxlane's OpenAI-compatible API on a backend, for tests:
``python -m tests.app.openai_server PORT BACKEND``."""
from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import uvicorn
from fastapi import FastAPI

from app.backends import make_llm_backend
from app.config import load_config
from app.openai_api import openai_router

if __name__ == "__main__":
    port, backend_name = int(sys.argv[1]), sys.argv[2]
    config = load_config(environ={})
    app = FastAPI()
    app.include_router(openai_router(make_llm_backend(config, backend_name), config.models.llm))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
