"""A speaker's echo at the microphone, as the echo rig makes it (``scripts/virtual-audio.sh echo on``)."""

from __future__ import annotations

import numpy as np

from assistant.stages.echo_linear import fractional_read


def echo_of(far: np.ndarray, delay_ms: float = 60, gain_db: float = -13, drift: float = 0.0) -> np.ndarray:
    """``far`` delayed and attenuated, with a weaker reflection 23 ms later (like the rig).

    ``drift``: the delay's growth per sample (the rig's loopback resamples: ~1e-4, 0.1 ms a
    second), read between samples.
    """
    g = 10 ** (gain_db / 20)
    if not drift:
        d, r = int(delay_ms * 16), int((delay_ms + 23) * 16)
        out = np.zeros_like(far)
        out[d:] += g * far[: len(far) - d]
        out[r:] += g / 2 * far[: len(far) - r]
        return out
    n = np.arange(far.size, dtype=np.float64)
    out = np.zeros(far.size)
    for tap_ms, gain in ((delay_ms, g), (delay_ms + 23, g / 2)):
        at = n - tap_ms * 16 - drift * n
        out[at >= 8] += gain * fractional_read(far, at[at >= 8])
    return out.astype(far.dtype)


def speechlike(seconds: float, seed: int) -> np.ndarray:
    """Noise with syllable-rate (4 Hz) bursts and speech's low-pass tilt, about -20 dBFS."""
    rng = np.random.default_rng(seed)
    n = int(seconds * 16000)
    noise = np.convolve(rng.standard_normal(n), np.ones(4) / 4, mode="same")
    t = np.arange(n) / 16000
    envelope = np.clip(np.sin(2 * np.pi * 4 * t + rng.uniform(0, 6)), 0, None) ** 0.5
    return (0.2 * noise * envelope).astype(np.float32)
