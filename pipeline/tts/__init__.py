"""Text-to-speech backends behind one interface: ``synthesize(text, speaking_rate)`` yields int16
chunks at ``sample_rate``. Piper is the default; Coqui is optional; flite/espeak-ng are fallbacks."""
from pipeline.tts.base import Cancel, TTSBackend, TTSError
from pipeline.tts.factory import TTSProvider, create_tts

__all__ = ["Cancel", "TTSBackend", "TTSError", "TTSProvider", "create_tts"]
