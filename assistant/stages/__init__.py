"""The voice loop's stages: audio, devices, VAD, end of turn, ASR, dialogue, splitter, TTS."""
