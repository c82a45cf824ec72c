"""Real pyttsx3 / espeak-ng speech heard by Whisper."""

from __future__ import annotations

import re

import pytest


@pytest.mark.slow
def test_whisper_hears_paris(paris_audio, store):
    from faster_whisper import WhisperModel

    folder = store.fetch("whisper-tiny.en", progress=lambda _msg: None)
    model = WhisperModel(str(folder), device="cpu", compute_type="int8", cpu_threads=2)
    segments, _info = model.transcribe(paris_audio, language="en", beam_size=5)
    transcript = " ".join(s.text for s in segments)
    assert "paris" in re.sub(r"[^a-z ]", " ", transcript.lower()).split(), transcript
