"""The microphone as the turn engine hears it: echo-cancelled, and whether it can be heard over replies.

:class:`Duplex` sits between the microphone and the endpointer on the capture thread. It hands
the echo canceller (:mod:`assistant.stages.echo`) what the speaker played (the speaker's
callback appends each block with the time it leaves the speaker to ``Speaker.far_end``) and
each microphone block with the time it was captured, and passes on the cancelled signal.
Once the canceller has converged it is *full duplex*: the microphone is heard while replies
play. Until then, or without a canceller, it is half duplex and the turn engine gates the
microphone during replies. Each change is reported as an :class:`~assistant.events.EchoState`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from assistant.events import EchoState, Event
from assistant.stages.audio import SAMPLE_RATE_HZ, Microphone, Speaker, resample
from assistant.stages.devices import DeviceLostError
from assistant.stages.echo import EchoCanceller, EchoStats
from assistant.stages.echo_linear import EchoSpan, EchoTrack
from assistant.turns.echo_mode import EchoMode

logger = logging.getLogger(__name__)

FAR_END_BLOCKS = 2000  # speaker blocks kept for the capture thread (a minute at 32 ms)
FAR_LEAD_NS = 1_000_000_000  # far end handed over this far ahead of the microphone block
CHECK_EVERY_BLOCKS = 5  # how often the canceller's convergence is looked at
PROBE_S = 0.8  # the window the convergence is judged on (0.5 s) needs whole far-end frames
PROBE_DBFS = -24.0
PROBE_TAIL_NS = 300_000_000  # the probe's echo and room tail, after it left the speaker
PROBE_WAIT_S = 3.0  # at most this long for the speaker to write the probe out
UNSUPPRESSED_S = 10  # how much of the raw microphone and far end is kept for the overlap judge
# A microphone block this much later than the one before it plus its length: the capture side
# stalled (the blocks come within 0.3 ms of their length on an idle machine, 280-300 ms late
# after the process was held 300 ms; once 111 ms just after start), and the echo path may move
# as after an xrun.
STALL_NS = 150_000_000
# Until the canceller has heard this much far end (the probe's 0.8 s and a first reply), its
# suppressor takes the first syllables of words said over a reply with the echo: the rest of a
# question said at a session's first reply lost 8 of 112 words, still 1 after 2 s of a reply,
# none after 5 s (bench.continuation_closed_loop, docs/benchmarks.md).
SETTLED_FAR_S = 6.0


def probe_signal(seconds: float = PROBE_S, dbfs: float = PROBE_DBFS) -> np.ndarray:
    """A soft hiss (pink-ish noise, faded in and out) that the canceller converges on."""
    rng = np.random.default_rng(7)
    n = int(seconds * SAMPLE_RATE_HZ)
    white = rng.standard_normal(n)
    spectrum = np.fft.rfft(white) / np.sqrt(np.maximum(np.arange(n // 2 + 1), 1))  # 1/f power
    noise = np.fft.irfft(spectrum, n)
    noise *= 10 ** (dbfs / 20) / max(float(np.sqrt(np.mean(noise**2))), 1e-9)
    fade = np.minimum(1.0, np.minimum(np.arange(n), np.arange(n)[::-1]) / (0.02 * SAMPLE_RATE_HZ))
    return (noise * fade).astype(np.float32)


class Duplex:
    """Echo cancellation on the capture path, and whether the microphone is heard over replies.

    Args:
        canceller: The echo canceller, or ``None`` (half duplex: ``reason`` says why).
        reason: Why there is no canceller, or that there is one (for the status bar).
        speaker: The speaker whose playback is the far end (``None``: nothing to cancel).
        microphone: The microphone (its input latency places each block in time).
        probe: Play :func:`probe_signal` (:meth:`play_probe`, at the latest at :meth:`start`)
            so the canceller converges before the first reply.
    """

    def __init__(
        self,
        canceller: EchoCanceller | None,
        reason: str,
        speaker: Speaker | None,
        microphone: Microphone | None,
        probe: bool = True,
    ) -> None:
        self.canceller = canceller if speaker is not None else None
        self.reason = reason if speaker is not None or canceller is None else "no speaker: nothing to cancel"
        self.speaker = speaker
        self.microphone = microphone
        self.probe = probe and self.canceller is not None
        self.mode = EchoMode(self.canceller) if self.canceller is not None else None
        self.probe_until_ns = 0  # the microphone hears the probe until then: not the user
        self._blocks = 0
        self._far_frames = 0  # the canceller's count at the last look
        self._erles: list[float] = []  # ERLE of the windows while the far end played, since report()
        self._xruns = self._xrun_count()  # the streams' xruns so far (each may move the echo path)
        self._last_block_ns = 0  # when the microphone's last block arrived
        self._unsuppressed = EchoTrack(UNSUPPRESSED_S)  # what went into the canceller
        if self.canceller is not None and speaker is not None:
            speaker.far_end = deque(maxlen=FAR_END_BLOCKS)

    @property
    def full_duplex(self) -> bool:
        """Whether the microphone is heard over replies (:class:`~assistant.turns.echo_mode.EchoMode`)."""
        return self.mode is not None and self.mode.full_duplex

    def play_probe(self) -> None:
        """Start the microphone and play the probe now (while the models load), once."""
        if not self.probe or self.probe_until_ns or self.speaker is None:
            return
        if self.microphone is not None:
            self.microphone.start()  # its blocks queue until the capture thread reads them
        signal = probe_signal()
        try:
            self.speaker.play(0, signal)
        except Exception as e:  # a lost speaker: the first reply converges it instead
            logger.info("echo probe not played: %s", e)
            return
        played_ns = signal.size * 1_000_000_000 // SAMPLE_RATE_HZ
        ahead_ns = int(self.speaker.output_latency_ms * 1e6) + played_ns
        self.probe_until_ns = _now() + ahead_ns + PROBE_TAIL_NS

    def start(self, emit: Callable[[Event], None]) -> None:
        """Report the mode to ``emit``, play the probe if not yet played, wait until it has passed.

        The microphone's blocks queued while the models loaded (the probe's echo among them)
        go through the canceller first, and are dropped: they are not the user's turn.
        """
        if self.mode is None:
            emit(EchoState(0, _now(), False, f"half duplex: {self.reason}"))
            return
        self.mode.emit = emit
        emit(EchoState(0, _now(), False, "half duplex until echo cancellation converges"))
        self.play_probe()
        if self.microphone is not None and self.probe_until_ns:
            # The models may have loaded before the probe's echo ended: "listening" comes after
            # it, so that nothing the user says then falls under the probe's gate.
            self._await_probe_played()
            _sleep_ns(self.probe_until_ns - _now())
            with contextlib.suppress(DeviceLostError):  # the capture thread reports it
                while (block := self.microphone.read(0)) is not None:
                    self.clean(*block)
            self._erles = []  # the probe's: not a reply's

    def _await_probe_played(self) -> None:
        """Wait until the speaker has written the probe; move ``probe_until_ns`` to its real end.

        ``probe_until_ns`` was estimated from the stream's reported output latency, which a
        sound server can exceed: then the probe still played after "listening on", the canceller
        took the user's first words for its echo and suppressed them ("What is the capital of
        Italy?" heard as "A capital of Italy."). The time each block left the speaker is in the
        far end the speaker's callback records: the probe's last sound block sets the end.
        """
        speaker = self.speaker
        if speaker is None or speaker.far_end is None:
            return
        with contextlib.suppress(DeviceLostError):
            speaker.wait(PROBE_WAIT_S)
        sounding = [(block, t_ns) for block, t_ns in list(speaker.far_end) if np.any(block)]
        if sounding:
            block, t_ns = sounding[-1]
            end_ns = t_ns + len(block) * 1_000_000_000 // speaker.rate_hz + PROBE_TAIL_NS
            if end_ns > self.probe_until_ns:
                logger.info(
                    "echo probe left the speaker %.0f ms later than its output latency said",
                    (end_ns - self.probe_until_ns) / 1e6,
                )
                self.probe_until_ns = end_ns

    def probing(self, now_ns: int) -> bool:
        """Whether the microphone may still hear the start-up probe (so it is not listened to)."""
        return now_ns < self.probe_until_ns

    def stats(self) -> EchoStats | None:
        """The canceller's ERLE, delay and convergence so far (``None`` without one)."""
        return self.canceller.stats() if self.canceller is not None else None

    def report(self) -> tuple[float | None, float | None]:
        """(ERLE dB, echo delay ms) since the last report: over the reply that just played.

        The ERLE is the median of the canceller's half-second windows while the speaker played
        (speech over the reply lowers a window's; the median keeps to the echo).
        """
        stats = self.stats()
        erle = float(np.median(self._erles)) if self._erles else None
        self._erles = []
        return erle, stats.delay_ms if stats is not None else None

    def clean(self, samples: np.ndarray, t_ns: int) -> tuple[np.ndarray, int]:
        """The microphone block without the speaker's echo, and the time of its last sample.

        ``t_ns`` is when the block's last sample was delivered. The cancelled signal runs up to
        10 ms behind (whole 10 ms frames only); the time returned is its own last sample's.
        """
        canceller = self.canceller
        if canceller is None:
            return samples, t_ns
        self._feed_far_end(until_ns=t_ns + FAR_LEAD_NS)
        mic_latency = self.microphone.input_latency_ns if self.microphone is not None else 0
        first_ns = t_ns - int((samples.size - 1) * 1e9 / SAMPLE_RATE_HZ) - mic_latency
        out = canceller.process(samples, first_ns)
        behind_ns = int(canceller.pending_samples * 1e9 / SAMPLE_RATE_HZ)
        self._unsuppressed.add_near(out.near, t_ns - behind_ns)
        self._blocks += 1
        xruns, late_ns = self._xrun_count(), t_ns - self._last_block_ns - _duration_ns(samples.size)
        self._last_block_ns = t_ns
        if xruns != self._xruns:
            self._xruns = xruns
            self._ran_late(f"an audio stream ran late (xrun, {xruns} so far)")
        elif late_ns > STALL_NS and self._blocks > 1:
            self._ran_late(f"the microphone's blocks came {late_ns / 1e6:.0f} ms late")
        if self._blocks % CHECK_EVERY_BLOCKS == 0:
            self._check()
        return out.vad, t_ns - behind_ns

    def unsuppressed(self, t_end_ns: int, samples: int) -> EchoSpan | None:
        """The ``samples`` ending at ``t_end_ns`` for an echo removal without suppression.

        What :meth:`clean` passes on has AEC3's suppression and the residual gate in it, which
        also take the soft start of a word said over the reply (the "s" and "t" of "Stop."):
        :meth:`EchoSpan.cleaned <assistant.stages.echo_linear.EchoSpan.cleaned>` gives the same
        stretch with the echo subtracted by a linear fit alone. ``None`` without a canceller,
        with no echo path (a headset: the microphone passed as it was), or when the stretch is
        no longer kept. ``settling`` while the canceller has heard under :data:`SETTLED_FAR_S`
        of far end.
        """
        if self.canceller is None or self.canceller.echo_free:
            return None
        span = self._unsuppressed.span(t_end_ns, samples)
        settling = self.canceller.far_heard_s < SETTLED_FAR_S
        return replace(span, settling=True) if span is not None and settling else span

    def _feed_far_end(self, until_ns: int) -> None:
        """Hand the canceller what the speaker played up to ``until_ns``.

        Not further ahead of the microphone than the canceller's far-end history reaches back:
        a backlog (blocks queued while the models loaded) is caught up in step.
        """
        assert self.speaker is not None and self.speaker.far_end is not None and self.canceller is not None
        far, rate = self.speaker.far_end, self.speaker.rate_hz
        while far and far[0][1] <= until_ns:
            block, t_ns = far.popleft()
            played = resample(block, rate, SAMPLE_RATE_HZ)
            self.canceller.play(played, t_ns)
            self._unsuppressed.add_far(played, t_ns + (played.size - 1) * 1_000_000_000 // SAMPLE_RATE_HZ)

    def _check(self) -> None:
        stats = self.stats()
        if stats is None or self.mode is None:
            return
        if stats.far_frames > self._far_frames and stats.erle_db is not None:
            self._erles.append(stats.erle_db)  # the far end played since the last look
        self._far_frames = stats.far_frames
        self.mode.check(stats)

    def _ran_late(self, what: str) -> None:
        """A stream ran late (``what``): the echo path may have moved (``EchoMode.ran_late``)."""
        logger.info("%s", what)
        stats = self.stats()
        if self.mode is not None and stats is not None:
            self.mode.ran_late(what, stats)

    def _xrun_count(self) -> int:
        return sum(stream.xruns for stream in (self.speaker, self.microphone) if stream is not None)


def _duration_ns(samples: int) -> int:
    return samples * 1_000_000_000 // SAMPLE_RATE_HZ


def _now() -> int:
    return time.monotonic_ns()


def _sleep_ns(ns: int) -> None:
    if ns > 0:
        time.sleep(ns / 1e9)
