"""What the echo canceller measures of the microphone and the far end: delay, loudness, echo left.

Pure functions on 16 kHz float32 arrays (the far end, the microphone and the canceller's output
over the same span), used by :class:`assistant.stages.echo.EchoCanceller`.
"""

from __future__ import annotations

import numpy as np

SAMPLE_RATE_HZ = 16000
FRAME_SAMPLES = 160  # 10 ms
FAR_ACTIVE_RMS = 10 ** (-50 / 20)  # a far-end frame above -50 dBFS counts as playing
LOUDNESS_FRAME_SAMPLES = 640  # 40 ms: a delay that wobbles by milliseconds stays in its frame


def estimate_delay(far: np.ndarray, near: np.ndarray, max_delay_ms: float) -> tuple[int, float]:
    """(lag in samples, normalized correlation) of ``near`` against ``far``, lags 0..max_delay_ms."""
    n = len(far)
    size = 1 << (2 * n - 1).bit_length()
    corr = np.fft.irfft(np.fft.rfft(near, size) * np.conj(np.fft.rfft(far, size)), size)
    max_lag = min(int(max_delay_ms * SAMPLE_RATE_HZ / 1000), n - 1)
    lag = int(np.argmax(np.abs(corr[: max_lag + 1])))
    norm = float(np.sqrt(np.sum(far[: n - lag] ** 2) * np.sum(near[lag:] ** 2)))
    return lag, float(abs(corr[lag]) / norm) if norm > 0 else 0.0


def loudness_match(far: np.ndarray, near: np.ndarray, lag: int) -> float:
    """How closely the loudness of ``near`` follows that of ``far`` ``lag`` samples earlier.

    The correlation of their levels (dB) in 40 ms frames, over the frames the far end played
    in; 0 with too few of them. 1 for an echo alone, however its delay wobbles within a frame;
    a voice over it that is not the far end's lowers it (on espeak-ng speech over 1-s spans:
    0.22-0.64 for one 10 dB louder than the echo, 0.59-0.88 for one as loud, 0.79-0.97 for one
    6 dB under it).
    """
    n = LOUDNESS_FRAME_SAMPLES
    far, near = far[: max(0, len(far) - lag)], near[lag:]
    k = min(len(far), len(near)) // n
    far_db, near_db = (
        10 * np.log10(np.mean(x[: k * n].reshape(k, n).astype(np.float64) ** 2, axis=1) + 1e-12)
        for x in (far, near)
    )
    playing = far_db > 20 * np.log10(FAR_ACTIVE_RMS)
    if playing.sum() < 10 or np.ptp(far_db[playing]) == 0 or np.ptp(near_db[playing]) == 0:
        return 0.0
    return float(np.corrcoef(far_db[playing], near_db[playing])[0, 1])


def levels_db(far: np.ndarray, near: np.ndarray, out: np.ndarray) -> tuple[float, float]:
    """(echo loss, ERLE) in dB over the 10 ms frames of a span that the far end played in.

    Echo loss: far end over microphone energy; ERLE: microphone over the canceller's output.
    """
    k = min(len(far), len(near), len(out)) // FRAME_SAMPLES
    e_far, e_near, e_out = (
        np.sum(x[: k * FRAME_SAMPLES].reshape(k, FRAME_SAMPLES).astype(np.float64) ** 2, axis=1)
        for x in (far, near, out)
    )
    playing = e_far > FAR_ACTIVE_RMS**2 * FRAME_SAMPLES
    f, m, o = (max(float(np.sum(e[playing])), 1e-12) for e in (e_far, e_near, e_out))
    return 10 * float(np.log10(f / m)), 10 * float(np.log10(m / o))
