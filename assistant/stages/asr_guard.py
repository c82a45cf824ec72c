"""What faster-whisper keeps when every temperature fails its checks, made honest for repetitive speech.

faster-whisper decodes a window at temperature 0, and again at 0.2 ... 1.0 while the text is
too repetitive (compression ratio > 2.4) or too unlikely (average log-probability < -1). When
all fail it keeps the best of those *below the compression threshold*, so genuinely
repetitive speech (fourteen sentences that differ by one number: ratio 3.6 at temperature
0, log-probability -0.26) lost to a random temperature-1.0 sample (log-probability -1.8):
either invented text ("Return 27-1 6-0 with 7% ...") or, with the no-speech rule, nothing
for the whole window. :class:`GuardedWhisper` keeps the most likely decode (temperature 0)
without sampling when it failed only for compressing too well, is confident and repeats no
stretch word for word (``asr_fit.sure_of_first``); after sampling, when it is confident or at
least as likely as the samples, and not a loop (``asr_fit.keep_first``). Otherwise the
window's segments keep the failed temperature, and ``asr_fit.unclear`` finds them so that
the caller drops their text and says that the stretch could not be transcribed. The sampled
temperatures start from a fixed seed, so the same audio gives the same transcript: unseeded,
the 85 s recording of tests/integration/test_repetitive_speech.py lost "Sentence number ten"
to an unlucky sample in 2 of 4 suite runs (2026-12-06).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ctranslate2
from faster_whisper import WhisperModel

from assistant.stages.asr_fit import keep_first, passes, sure_of_first

SAMPLING_SEED = 0


class GuardedWhisper(WhisperModel):
    """``WhisperModel`` that keeps the most likely decode of repetitive speech (see the module docstring).

    ``audio_s``: the longest stretch one window decodes (the caller sets it before ``transcribe``),
    which bounds the tokens a decode that is not a loop can hold.
    """

    audio_s: float = 30.0

    def generate_with_fallback(
        self, encoder_output: Any, prompt: list[int], tokenizer: Any, options: Any
    ) -> tuple[Any, float, float, float]:
        """Temperature 0 first; the other temperatures only if it fails and is not ``sure_of_first``.

        Then ``keep_first`` decides between the two.
        """
        temperatures = list(options.temperatures)
        first = super().generate_with_fallback(
            encoder_output, prompt, tokenizer, dataclasses.replace(options, temperatures=temperatures[:1])
        )
        if passes(first) or len(temperatures) == 1:
            return first
        text = tokenizer.decode(first[0].sequences_ids[0])
        short = bool(options.without_timestamps)
        if sure_of_first(first, text, self.audio_s, short):
            return first
        ctranslate2.set_random_seed(SAMPLING_SEED)
        rest = super().generate_with_fallback(
            encoder_output, prompt, tokenizer, dataclasses.replace(options, temperatures=temperatures[1:])
        )
        return first if keep_first(first, rest, text, self.audio_s, short) else rest
