"""Speech over a reply with the echo removed by a linear fit alone: what the judge of its words hears.

AEC3 (:mod:`assistant.stages.echo`) suppresses what its linear filter leaves of the echo, and
while the user talks over the reply it suppresses the soft start of their words with it: a lone
"Stop." came out "Up.", "Top." or nothing. For the judge of such words the microphone is
cleaned here by subtraction only. The echo path's impulse response is fitted by least squares
over the second of echo before the speech, and the echo it predicts from what the speaker
played is subtracted over the speech. Nothing is suppressed, so the consonants stay; the echo
is 16-28 dB down (the rig's echo, in closed loop): enough for tiny.en to read a word, not for
the VAD, which keeps AEC3's output.

The speaker's and the microphone's clocks drift apart (~0.1 ms a second on the echo rig, or
two devices), and a fit one sample off removes only ~10 dB. The drift is measured over the two
halves of the fitted second (sub-sample correlation peaks), and the far end is resampled by it
before the fit.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

import numpy as np

SAMPLE_RATE_HZ = 16000
FIT_S = 1.0  # echo alone before the speech, to fit the path on
GAP_S = 0.05  # the fit ends this long before the speech: its onset is found late
LEAD_S = 0.5  # the far end reaches this much further back than the microphone
PRE_MS, POST_MS = 8, 60  # taps before and after the echo's delay (the direct path and the room)
MAX_DELAY_MS = 400
DRIFT_REACH_MS = 2.5  # the drift's search around the delay, per half
REGULARISE = 1e-3  # of the far end's power, on the fit's diagonal
UPSAMPLE = 8  # the lag's correlation is read this much finer than a sample
SINC_HALF = 8  # taps each side of the resampler's windowed sinc
FAR_ACTIVE = 10 ** (-50 / 10)  # far-end power (-50 dBFS) under which nothing played to fit on


@dataclass(frozen=True)
class EchoSpan:
    """The raw microphone and what the speaker played, lined up in time to a few milliseconds.

    ``near`` holds the fitted stretch (:data:`FIT_S` + :data:`GAP_S`) and then the speech: its
    last ``samples``. ``far`` ends with it and starts :data:`LEAD_S` earlier (the echo's delay).
    ``settling``: the canceller had not yet heard enough of the far end to converge on speech
    (``Duplex.unsuppressed``), and its suppressor may have taken the speech's first syllables.
    """

    near: np.ndarray
    far: np.ndarray
    samples: int
    settling: bool = False

    def microphone(self) -> np.ndarray:
        """The speech as the microphone heard it, echo and all."""
        return self.near[self.near.size - self.samples :]

    def cleaned(self) -> np.ndarray | None:
        """The speech with the echo the fit predicts subtracted; ``None`` if nothing played before it."""
        ms = SAMPLE_RATE_HZ // 1000
        lead, size = self.far.size - self.near.size, self.near.size
        speech = size - self.samples
        fit_end = speech - int(GAP_S * SAMPLE_RATE_HZ)
        fit_start = fit_end - int(FIT_S * SAMPLE_RATE_HZ)
        far, near = self.far.astype(np.float64), self.near.astype(np.float64)
        y = near[fit_start:fit_end]
        if fit_start < 0 or float(np.mean(far[lead + fit_start : lead + fit_end] ** 2)) < FAR_ACTIVE:
            return None
        reach, longest = int(DRIFT_REACH_MS * ms), min(MAX_DELAY_MS * ms, lead - POST_MS * ms - SINC_HALF)
        delay = _lag(far[lead + fit_start - longest : lead + fit_end], y, longest, 1, longest - reach)
        half, low, high = y.size // 2, round(delay) - reach, round(delay) + reach
        halves = [
            _lag(far[lead + a - high : lead + a + half], near[a : a + half], high, low, high)
            for a in (fit_start, fit_start + half)
        ]
        drift = (halves[1] - halves[0]) / half  # the delay's growth per sample
        n = np.arange(far.size, dtype=np.float64)
        warped = fractional_read(far, n - drift * (n - lead - fit_end))  # the echo's delay now steady
        first, taps = max(0, round(delay) - PRE_MS * ms), (PRE_MS + POST_MS) * ms
        at = lead - first - taps + 1  # warped[at + i .. at + i + taps - 1] echo in near[i]
        h = _fit(warped[at + fit_start : at + fit_end + taps - 1], y, taps)
        echo = np.convolve(warped[at + speech : at + size + taps - 1], h, "valid")
        return (near[speech:] - echo).astype(np.float32)


def _fit(far: np.ndarray, near: np.ndarray, taps: int) -> np.ndarray:
    """The FIR ``h`` with ``near[i] ~ sum_k h[k] far[i + taps - 1 - k]`` in the least-squares sense.

    ``far`` is ``taps - 1`` samples longer than ``near``. The normal equations, exact: with the
    far end's autocorrelation alone as their matrix, the edges a second of far end does not
    cover left ~20 dB of a plain delayed echo.
    """
    n, size = near.size, 1 << (far.size + near.size).bit_length()
    spectrum = np.fft.rfft(far, size)
    cross = np.fft.irfft(spectrum * np.conj(np.fft.rfft(near, size)), size)  # sum_i far[i+m] near[i]
    head = np.fft.rfft(far[:n], size)
    first_row = np.fft.irfft(spectrum * np.conj(head), size)[:taps]  # C(0, d) = sum_{i<n} far[i] far[i+d]
    # C(t, t + d) = sum_{i<n} far[i+t] far[i+t+d]: each step along a diagonal gains one product
    # at the end and loses one at the start.
    t, d = np.arange(taps - 1)[:, None], np.arange(taps)[None, :]
    last = far.size - 1
    ends = far[n + t] * far[np.minimum(n + t + d, last)]
    starts = far[t] * far[np.minimum(t + d, last)]
    along = first_row + np.vstack([np.zeros((1, taps)), np.cumsum(ends - starts, axis=0)])  # C(t, t + d)
    rows, cols = np.nonzero(np.arange(taps)[:, None] + d < taps)
    matrix = np.empty((taps, taps))
    matrix[rows, rows + cols] = along[rows, cols]
    matrix[rows + cols, rows] = along[rows, cols]
    matrix = matrix[::-1, ::-1]  # tap k reads far[i + taps - 1 - k]
    matrix[np.diag_indices(taps)] += REGULARISE * first_row[0] / taps + 1e-12
    return np.linalg.solve(matrix, cross[:taps][::-1])


def _lag(far: np.ndarray, near: np.ndarray, before: int, low: int, high: int) -> float:
    """How many samples ``near`` follows ``far`` by (``low..high``), to a fraction of a sample.

    ``far`` starts ``before`` samples ahead of ``near`` (``before >= high``). The correlation is
    read :data:`UPSAMPLE` times finer than a sample (its spectrum zero-padded), then the
    parabola through its peak: a parabola through whole samples alone reads a lag drawn
    towards the nearest whole one, which made the drift 20 % short.
    """
    size = 1 << (far.size + near.size).bit_length()
    spectrum = np.fft.rfft(far, size) * np.conj(np.fft.rfft(near, size))
    cross = np.fft.irfft(spectrum, size * UPSAMPLE)  # sum_i near[i] far[i + m], m in 1/UPSAMPLE
    steps = before * UPSAMPLE - np.arange((low - 1) * UPSAMPLE, (high + 1) * UPSAMPLE + 1)
    lags = cross[steps]  # at lag low - 1 .. high + 1, UPSAMPLE a sample
    k = 1 + int(np.argmax(lags[1:-1]))
    a, b, c = lags[k - 1], lags[k], lags[k + 1]
    bend = a - 2 * b + c
    return low - 1 + (k + (0.5 * (a - c) / bend if bend < 0 else 0.0)) / UPSAMPLE


def fractional_read(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``x`` read at fractional ``positions`` (a windowed sinc of 2 * :data:`SINC_HALF` taps)."""
    whole = np.floor(positions).astype(np.int64)
    k = np.arange(-SINC_HALF + 1, SINC_HALF + 1)
    t = (positions - whole)[:, None] - k[None, :]
    window = np.sinc(t) * (0.5 + 0.5 * np.cos(np.pi * t / SINC_HALF))
    return np.sum(x[np.clip(whole[:, None] + k[None, :], 0, x.size - 1)] * window, axis=1)


class EchoTrack:
    """The last ``seconds`` of the raw microphone and of what the speaker played, each as a stream.

    Each is added block by block with the time of its last sample, and read back by sample
    count from the newest (:class:`AudioTail`): the speaker's blocks follow each other with no
    gap whatever their callbacks' times say (they jitter by milliseconds, and a fit needs the
    far end whole to the sample), so only the span's place in time comes from the clock; the
    echo's delay is found in the fit.
    """

    def __init__(self, seconds: float) -> None:
        self._near = AudioTail(seconds)
        self._far = AudioTail(seconds)

    def add_near(self, samples: np.ndarray, t_end_ns: int) -> None:
        """Append a block of the microphone, whose last sample is from ``t_end_ns``."""
        self._near.add(samples, t_end_ns)

    def add_far(self, samples: np.ndarray, t_end_ns: int) -> None:
        """Append a block the speaker played (16 kHz), whose last sample leaves it at ``t_end_ns``."""
        self._far.add(samples, t_end_ns)

    def span(self, t_end_ns: int, samples: int) -> EchoSpan | None:
        """The ``samples`` ending at ``t_end_ns`` and the stretch the fit needs before them."""
        before = int((FIT_S + GAP_S) * SAMPLE_RATE_HZ)
        near = self._near.span(t_end_ns, samples + before)
        far = self._far.span(t_end_ns, samples + before + int(LEAD_S * SAMPLE_RATE_HZ))
        if near is None or far is None:
            return None
        return EchoSpan(near, far, samples)


class AudioTail:
    """The last ``seconds`` of a 16 kHz stream, added block by block and read back by time.

    The blocks follow each other sample by sample (the microphone's, the speaker's, or the
    canceller's output); each comes with the time of its last sample. Written by the capture
    thread, read by the turn engine's.
    """

    def __init__(self, seconds: float) -> None:
        self._blocks: deque[np.ndarray] = deque()
        self._size = 0
        self._keep = int(seconds * SAMPLE_RATE_HZ)
        self._end_ns = 0  # the time of the newest sample
        self._lock = threading.Lock()

    def add(self, samples: np.ndarray, t_end_ns: int) -> None:
        """Append ``samples``, the last of which is from ``t_end_ns``; forget what is too old."""
        if not samples.size:
            return
        with self._lock:
            self._blocks.append(samples)
            self._size += samples.size
            self._end_ns = t_end_ns
            while self._size - self._blocks[0].size >= self._keep:
                self._size -= self._blocks.popleft().size

    def span(self, t_end_ns: int, samples: int) -> np.ndarray | None:
        """The ``samples`` whose last is the one from ``t_end_ns`` (``None`` if not all are kept)."""
        with self._lock:
            # Newer samples after it (none when ``t_end_ns`` is the time of a decision made after
            # the newest sample: an end of turn's, which includes the turn model's inference).
            behind = max(0, round((self._end_ns - t_end_ns) * SAMPLE_RATE_HZ / 1e9))
            if not self._blocks or behind + samples > self._size:
                return None
            newest, held = [], 0  # only the newest blocks that hold the span, not all 10 s
            for block in reversed(self._blocks):
                newest.append(block)
                held += block.size
                if held >= behind + samples:
                    break
            kept = np.concatenate(newest[::-1])
        return kept[kept.size - behind - samples : kept.size - behind]
