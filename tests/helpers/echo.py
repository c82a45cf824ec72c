"""A speaker's echo at the microphone, as the echo rig makes it (``scripts/virtual-audio.sh echo on``)."""

from __future__ import annotations

import numpy as np


def echo_of(far: np.ndarray, delay_ms: float = 60, gain_db: float = -13) -> np.ndarray:
    """``far`` delayed and attenuated, with a weaker reflection 23 ms later (like the rig)."""
    d, r = int(delay_ms * 16), int((delay_ms + 23) * 16)
    g = 10 ** (gain_db / 20)
    out = np.zeros_like(far)
    out[d:] += g * far[: len(far) - d]
    out[r:] += g / 2 * far[: len(far) - r]
    return out
