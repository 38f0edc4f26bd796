"""Builds the configured LLM backend (engine, transformers reference, or a remote server)."""
from __future__ import annotations

from app import model_store
from app.config import AppConfig
from engine.backends.base import LLMBackend


def make_llm_backend(config: AppConfig, backend: str | None = None) -> LLMBackend:
    """The LLM backend named by ``backend`` (default: ``config.llm.backend``), with its model loaded."""
    kind = backend or config.llm.backend
    if kind == "openai":
        from engine.backends.remote import RemoteBackend, RemoteSettings

        llm = config.llm
        return RemoteBackend(RemoteSettings(llm.base_url, llm.remote_model, llm.api_key, llm.timeout_s,
                                            llm.max_retries, context_length=llm.remote_context_length))
    model_dir = model_store.resolve(config.models.llm, "llm")
    if kind == "transformers":
        from engine.backends.reference import TransformersBackend

        return TransformersBackend(model_dir, num_threads=config.engine.num_threads or None)  # one knob for both
    from engine.backends.engine_backend import EngineBackend

    return EngineBackend(model_dir, config.engine.with_weights(model_store.engine_weights(config.models.llm, config.engine.kernels)))
