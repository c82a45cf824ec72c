"""The sentence the TTS tests speak and listen for."""

PARIS = "The capital of France is Paris."
