"""Genuinely repetitive speech is transcribed as said, not replaced by invented text (issue 26, item 6).

Fourteen sentences that differ only by their number, 83 s of espeak-ng speech, transcribed in
clips as file mode does. Its temperature-0 decode is confident (log-probability -0.26) but
repetitive (compression ratio 3.6 > 2.4), so faster-whisper fell back through every
temperature and kept a random sample: invented text ("Return 27-1 6-0 with 7% ...") or, when
its no-speech rule dropped that sample, nothing for the whole 30 s window.
"""

from __future__ import annotations

import pytest

from assistant.stages.asr import AsrOptions, Transcriber
from bench.speech import SAMPLE_RATE_HZ, missing_numbers, number_word, speak
from store.bundled import ModelStore

pytestmark = pytest.mark.slow
SENTENCES = 14


def test_fourteen_near_identical_sentences_are_all_transcribed(store: ModelStore, tmp_path):
    text = " ".join(
        f"Sentence number {number_word(n)}. The quick brown fox jumps over the lazy dog near the river bank."
        for n in range(1, SENTENCES + 1)
    )
    audio = speak(text, tmp_path, "repetitive")
    assert 75 < audio.size / SAMPLE_RATE_HZ < 95
    store.fetch("whisper-tiny.en", progress=lambda _msg: None)
    result = Transcriber(AsrOptions(device="cpu", cpu_threads=2), store).transcribe(audio)
    heard = result.text.lower()
    assert missing_numbers(heard, SENTENCES) == [], heard
    assert heard.count("lazy dog") >= SENTENCES - 1, heard  # every sentence, nothing invented
    assert result.unclear == ()
