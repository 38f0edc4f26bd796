"""Speech to text: faster-whisper, the guard against hallucinated segments, and the ASR stage."""
