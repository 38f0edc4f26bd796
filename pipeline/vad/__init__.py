"""Voice activity: Silero per 32 ms frame, the turn detector's state machine, and the VAD stage."""
