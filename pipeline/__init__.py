"""Voxlane's voice pipeline: VAD -> streaming ASR -> LLM -> speakable chunks -> TTS, with barge-in."""
