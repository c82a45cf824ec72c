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
