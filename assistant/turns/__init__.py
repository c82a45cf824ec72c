"""Turn taking: the stage protocols, the turn engine, the reply gate, the live loop."""
