"""``resample``: the rate changes the stages make (the voices' 22.05 kHz to 16 kHz, the devices' rates)."""

from __future__ import annotations

import numpy as np

from assistant.stages.streams import resample


def test_a_full_scale_voice_downsampled_stays_within_full_scale():
    """Piper's 22.05 kHz voice reaches 1.0 on flat-topped peaks; the low-pass must not ring past it.

    (Piper once gave 1.0019 after resampling, and the integration test of the voice caught it.)
    """
    t = np.arange(22_050) / 22_050
    square = np.sign(np.sin(2 * np.pi * 220 * t)).astype(np.float32)  # the worst case: flat tops
    out = resample(square, 22_050, 16_000)
    assert out.dtype == np.float32 and out.size == 16_000
    assert np.abs(out).max() <= 1.0
    assert np.abs(out).max() > 0.9  # clipped, not scaled down


def test_a_tone_downsampled_keeps_its_shape_and_length():
    t = np.arange(48_000) / 48_000
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    out = resample(tone, 48_000, 16_000)
    expected = 0.5 * np.sin(2 * np.pi * 440 * np.arange(16_000) / 16_000)
    assert out.size == 16_000 and np.abs(out - expected)[64:-64].max() < 0.01
