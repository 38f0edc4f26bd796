"""End of turn: when has the user finished speaking? Signals (the audio model, the LM's reading of
the words) and the decision that fuses them with the silence so far."""
