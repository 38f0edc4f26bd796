"""LLM backends behind one protocol (``base.LLMBackend``): our engine, the transformers reference,
and a remote OpenAI-compatible server."""
