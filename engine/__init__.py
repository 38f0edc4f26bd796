"""Voxlane's LLM engine: a readable Llama-family decoder, KV-cache slots, INT8 weights,
a continuous small-batch scheduler and streaming text deltas."""
