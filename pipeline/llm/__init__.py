"""The answer: the LLM stage, the history it prompts with, and the speakable chunker it feeds TTS with."""
