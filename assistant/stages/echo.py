"""Acoustic echo cancellation: the microphone without what the speaker played into it.

WebRTC's audio processing (AEC3) through the LiveKit SDK (``livekit.rtc.AudioProcessingModule``;
docs/voice.md, "Echo cancellation", says why this one). The far end is what the speaker plays,
each block with the time its first sample leaves the speaker; the near end is the microphone,
each block with the time its first sample was captured. :class:`EchoCanceller` lines them up on
that one clock, so the far-end frame fed with a microphone frame is the one that was playing
when it was captured, and runs the canceller in 10 ms frames. It reports the echo return loss
enhancement (ERLE), the echo's delay and whether it has converged (:class:`EchoStats`).
No threads: the caller owns them (the far end from the playback side, the near end from the
capture side; a lock guards the far-end buffer).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from assistant.config.sections import EchoOptions
from assistant.stages.echo_measure import (
    FAR_ACTIVE_RMS,
    FRAME_SAMPLES,
    SAMPLE_RATE_HZ,
    estimate_delay,
    levels_db,
    loudness_match,
)

FAR_HISTORY_S = 4  # far-end audio kept for lining up and for the delay estimate
DELAY_EVERY_FRAMES = 50  # the delay estimate is redone every 0.5 s of far-end audio
DELAY_SPAN_FRAMES = 100  # over the last 1 s
# With no echo path known (a headset), an echo that appears (speakers) is looked for every
# 0.1 s over the last 0.4 s: until it is found the microphone passes as it is, echo and all.
ECHO_FREE_EVERY_FRAMES = 10
ECHO_FREE_SPAN_FRAMES = 40
DELAY_MIN_CORRELATION = 0.3  # a weaker peak is no echo (or the user talking over it)
# And only from a span the far end played in for at least half of it. The estimate comes due by
# far-end audio counted over the session, often a few frames into a reply that follows seconds
# of silence: the strongest lag of those frames alone was anywhere (a pitch period off: 62 -> 33,
# 45 -> 35, 37 -> 206 ms at first replies' starts on the echo rig), the path read as moved and
# the microphone was gated while the user went on with the question. Such a reading waits.
DELAY_MIN_FAR_FRAMES = DELAY_SPAN_FRAMES // 2
# The canceller lost the echo: over a delay estimate's span it removed under converged_erle_db of
# an echo that was there while the microphone's loudness followed the far end's at the echo's
# delay at least this closely (it held the echo alone). The user talking over the reply lowers
# the ERLE too but breaks the match (0.22-0.64 for a voice 10 dB louder than the echo); a path
# whose delay wobbles by milliseconds, which AEC3 cannot follow, keeps it (0.87-0.99 at 60 +- 8
# ms). Two spans in a row count.
ECHO_ALONE_MATCH = 0.9
LOST_SPANS = 2
# Near-end blocks follow each other by their sample count; callback times jitter by tens of
# ms, so only a disagreement beyond this is a real gap (blocks dropped) that starts afresh.
NEAR_GAP_SAMPLES = SAMPLE_RATE_HZ // 10
RESIDUAL_TAIL_MS = 100  # the room's tail after the echo's delay, for the residual gate
# The far end goes to AEC3 this far ahead of the microphone frame it is placed with: where the
# streams' timing puts the echo at or before its sound (a delay estimate of 0-1 ms on the echo
# rig, whose real path is 60 ms), AEC3 cannot remove what comes before its reference, and
# replies paused for their own echo. Delays are reported without it. The speaker's callback
# writes each block its output latency (~64 ms) before it plays: the lead is there in time.
LEAD_MS = 20
LEAD_SAMPLES = LEAD_MS * SAMPLE_RATE_HZ // 1000


class Cancelled(NamedTuple):
    """Near-end audio after the canceller, in whole 10 ms frames, and the microphone that went in.

    ``vad`` is what the app listens to (VAD, Smart Turn, ASR): AEC3's output with the frames of
    leftover echo silenced (the residual gate), or the microphone as it is where nothing that
    could echo was played. ``audio`` is the same without the gate. ``near`` is the microphone
    as it came in: AEC3 and the gate also suppress the soft start of a word said over the
    reply (the "s" and "t" of "Stop."), so the judge of such speech hears it with the echo
    removed by a linear fit alone (:mod:`assistant.stages.echo_linear`, ``Duplex.unsuppressed``).
    """

    audio: np.ndarray
    vad: np.ndarray
    near: np.ndarray


class EchoUnavailable(RuntimeError):
    """The echo canceller cannot run here (``[echo] enabled = "on"`` and no WebRTC module)."""


@dataclass(frozen=True)
class EchoStats:
    """What the canceller has done so far.

    ``erle_db``: echo removed over the last ``window_ms`` of far-end audio (input energy over
    output energy; the user talking over the reply lowers it; ``None`` while the window is not
    full, or when there was no echo to remove). ``delay_ms``: the echo's delay
    beyond the streams' timing (cross-correlation of microphone and far end), ``None`` until an
    echo was found. ``echo_loss_db``: how far below the far end the microphone was over the same
    frames (the room's echo return loss; large with a headset). ``converged``: what is left of
    the echo is at least ``converged_below_db`` under the far end (``echo_loss_db + erle_db``),
    and the canceller did it (``erle_db`` reached ``converged_erle_db``) or there was no echo
    to speak of (``echo_loss_db`` alone is that far down). ``echo_lost``: over the spans of the
    last two delay estimates (a second of far end each) the canceller removed under
    ``converged_erle_db`` of an echo that was there while the microphone held the echo alone, its
    loudness following the far end's (:func:`~assistant.stages.echo_measure.loudness_match`):
    the user talking over the reply lowers the ERLE as well, but not that.
    """

    erle_db: float | None
    delay_ms: float | None
    converged: bool
    far_frames: int  # 10 ms frames processed while the far end played
    echo_loss_db: float | None = None
    echo_lost: bool = False


def load_processor(options: EchoOptions) -> Any:
    """A WebRTC AudioProcessingModule with echo cancellation on.

    Raises:
        EchoUnavailable: The ``livekit`` package is missing or its native library does not load.
    """
    try:
        from livekit import rtc
    except (ImportError, OSError) as e:
        raise EchoUnavailable(
            f"echo cancellation needs the livekit package: pip install livekit ({e})"
        ) from e
    return rtc.AudioProcessingModule(
        echo_cancellation=True,
        noise_suppression=options.noise_suppression,
        high_pass_filter=options.high_pass_filter,
    )


def echo_canceller(options: EchoOptions) -> tuple[EchoCanceller | None, str]:
    """The canceller ``options`` ask for, or ``None``, with the reason in words (for the status bar).

    Raises:
        EchoUnavailable: ``enabled = "on"`` and the canceller cannot be loaded.
    """
    if options.enabled == "off":
        return None, "echo cancellation off ([echo] enabled)"
    try:
        return EchoCanceller(options, load_processor(options)), "echo cancellation on (WebRTC AEC3)"
    except EchoUnavailable as e:
        if options.enabled == "on":
            raise
        return None, str(e)


class EchoCanceller:
    """Removes the far end's echo from near-end blocks, lined up by time.

    Args:
        options: The ``[echo]`` section.
        processor: A WebRTC AudioProcessingModule (:func:`load_processor`).
        origin_ns: The time of far-end sample 0 (``time.monotonic_ns()`` clock); default: the
            first far-end or near-end block's time.
    """

    def __init__(self, options: EchoOptions, processor: Any, origin_ns: int | None = None) -> None:
        from livekit import rtc

        self.options = options
        self._rtc = rtc
        self._apm = processor
        self._apm.set_stream_delay_ms(options.delay_hint_ms)
        self._origin_ns = origin_ns
        self._lock = threading.Lock()
        self._far = np.zeros(FAR_HISTORY_S * SAMPLE_RATE_HZ, np.int16)
        self._far_end = 0  # far-end timeline index one past the newest sample written
        self._pending = np.zeros(0, np.int16)  # near-end samples short of a whole frame
        self._next = 0  # timeline index of the next near-end sample to process
        self._started = False
        window = max(1, options.window_ms // 10)
        # (in, out, far) energies of the frames while the far end played
        self._energy: deque[tuple[float, float, float]] = deque(maxlen=window)
        self._delay_near: deque[np.ndarray] = deque(maxlen=DELAY_SPAN_FRAMES)
        self._delay_far: deque[np.ndarray] = deque(maxlen=DELAY_SPAN_FRAMES)
        self._delay_far_active: deque[bool] = deque(maxlen=DELAY_SPAN_FRAMES)
        self._delay_due = False  # an estimate came due and waits for enough far end in the span
        self._far_frames = 0
        self._delay_ms: float | None = None
        self._delay_out: deque[np.ndarray] = deque(maxlen=DELAY_SPAN_FRAMES)  # the canceller's output
        self._lost_spans = 0  # delay estimates in a row over which the canceller had lost the echo
        reach = (options.max_delay_ms + RESIDUAL_TAIL_MS) // 10
        self._far_recent: deque[float] = deque([0.0], maxlen=max(1, reach))  # far-end power per frame
        self.gated_frames = 0  # frames silenced as residual echo
        # No echo path (a headset): the far end never reached the microphone. The microphone
        # then passes as it is; the canceller keeps adapting, and a correlated echo ends this.
        self.echo_free = False

    def _index(self, t_ns: int) -> int:
        if self._origin_ns is None:
            self._origin_ns = t_ns
        return round((t_ns - self._origin_ns) * SAMPLE_RATE_HZ / 1e9)

    @property
    def far_heard_s(self) -> float:
        """Seconds of far end (above -50 dBFS) the canceller has processed, the probe's included."""
        return self._far_frames * FRAME_SAMPLES / SAMPLE_RATE_HZ

    def play(self, samples: np.ndarray, t_ns: int) -> None:
        """Note far-end ``samples`` (16 kHz float32 or int16) whose first leaves the speaker at ``t_ns``."""
        pcm = _int16(samples)
        with self._lock:
            start = self._index(t_ns)
            size = len(self._far)
            if start + len(pcm) <= self._far_end - size:
                return  # older than the history
            if start > self._far_end:  # a gap (nothing played): silence
                self._write(self._far_end, np.zeros(min(start - self._far_end, size), np.int16))
            self._write(start, pcm[-size:] if len(pcm) > size else pcm)
            self._far_end = max(self._far_end, start + min(len(pcm), size))

    def _write(self, start: int, pcm: np.ndarray) -> None:
        size = len(self._far)
        idx = (start + np.arange(len(pcm))) % size
        self._far[idx] = pcm

    def _far_frame(self, start: int) -> np.ndarray:
        with self._lock:
            size = len(self._far)
            if start >= self._far_end or start + FRAME_SAMPLES <= self._far_end - size:
                return np.zeros(FRAME_SAMPLES, np.int16)
            frame = self._far[(start + np.arange(FRAME_SAMPLES)) % size].copy()
            frame[max(0, self._far_end - start) :] = 0  # not written yet
            frame[: max(0, self._far_end - size - start)] = 0  # overwritten already
            return frame

    @property
    def pending_samples(self) -> int:
        """Near-end samples waiting for a whole frame: how far the output runs behind the input."""
        return len(self._pending)

    def process(self, samples: np.ndarray, t_ns: int) -> Cancelled:
        """Cancel the echo in near-end ``samples`` captured from ``t_ns``; float32 out.

        Returns the whole 10 ms frames completed so far (:class:`Cancelled`: ungated, with
        leftover echo silenced, and what went in): up to 159 samples wait for the next
        block, so the output runs up to 10 ms behind the input. Blocks follow each other by
        their sample count; one whose time is more than :data:`NEAR_GAP_SAMPLES` off (blocks
        were dropped) starts a new timeline position (what was pending is dropped).
        """
        pcm = _int16(samples)
        with self._lock:
            start = self._index(t_ns)
        expected = self._next + len(self._pending)
        if self._started and abs(start - expected) <= NEAR_GAP_SAMPLES:
            start = expected  # contiguous: the clock's jitter is not a gap
        if not self._started or start != expected:
            self._pending, self._next, self._started = pcm, start, True
        else:
            self._pending = np.concatenate([self._pending, pcm])
        frames = len(self._pending) // FRAME_SAMPLES
        out = Cancelled(*(np.empty(frames * FRAME_SAMPLES, np.float32) for _ in Cancelled._fields))
        for i in range(frames):
            s = slice(i * FRAME_SAMPLES, (i + 1) * FRAME_SAMPLES)
            out.audio[s], out.vad[s], out.near[s] = self._frame(
                self._pending[s], self._next + i * FRAME_SAMPLES
            )
        self._pending = self._pending[frames * FRAME_SAMPLES :]
        self._next += frames * FRAME_SAMPLES
        return out

    def _frame(self, near: np.ndarray, start: int) -> Cancelled:
        far = self._far_frame(start + LEAD_SAMPLES)
        rtc = self._rtc
        self._apm.process_reverse_stream(rtc.AudioFrame(far.tobytes(), SAMPLE_RATE_HZ, 1, FRAME_SAMPLES))
        frame = rtc.AudioFrame(near.tobytes(), SAMPLE_RATE_HZ, 1, FRAME_SAMPLES)
        self._apm.set_stream_delay_ms(self.options.delay_hint_ms)
        self._apm.process_stream(frame)
        out = np.frombuffer(frame.data, np.int16).astype(np.float32) / 32768
        far_f, near_f = far.astype(np.float32) / 32768, near.astype(np.float32) / 32768
        self._delay_near.append(near_f)  # every frame: the lag needs them contiguous
        self._delay_out.append(out)
        self._delay_far.append(far_f)
        far_power = float(np.mean(far_f**2))
        self._far_recent.append(far_power)
        far_active = far_power > FAR_ACTIVE_RMS**2
        self._delay_far_active.append(far_active)
        if far_active:
            self._energy.append((float(np.sum(near_f**2)), float(np.sum(out**2)), float(np.sum(far_f**2))))
            self._far_frames += 1
            if self._far_frames % (ECHO_FREE_EVERY_FRAMES if self.echo_free else DELAY_EVERY_FRAMES) == 0:
                self._delay_due = True
            if self._delay_due and (self.echo_free or sum(self._delay_far_active) >= DELAY_MIN_FAR_FRAMES):
                self._delay_due = False
                self._estimate_delay()
        if self.echo_free:
            return Cancelled(near_f, near_f, near_f)
        return Cancelled(*self._gate_residual(out, near_f), near_f)

    def _gate_residual(self, out: np.ndarray, near: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ungated, gated): the gated view has what is left of the echo silenced.

        Left-over echo is output ``residual_gate_db`` under what just played. The loudest
        far-end frame whose echo can be in this frame sets the level: around the estimated
        echo delay plus a room tail once the delay is known, else over the whole reach
        (``max_delay_ms`` plus the tail). The user's own voice at the microphone is louder
        than that by far; after the reply pauses, the gate lets go once its echo has passed.
        When nothing that could echo here was played, the microphone passes as it is: AEC3 on
        speech alone is not quite transparent, and tiny.en heard "capital and friends" in it. AEC3
        leaves a little echo while it adapts to a new signal (the first words of a reply), which
        the VAD would otherwise take for speech over the reply. The ungated view keeps such
        frames: the soft start of a word said over the reply is under the gate too (the "s" and
        "t" of "Stop." were silenced, and tiny.en heard nothing in the rest).
        """
        gate_db = self.options.residual_gate_db
        recent = self._far_recent
        if self._delay_ms is not None:  # the echo of now left the speaker this long ago: look there
            lag = round(self._delay_ms / 10)
            lags = range(max(0, lag - 2), min(len(recent), lag + RESIDUAL_TAIL_MS // 10 + 1))
            loudest = max((recent[-1 - k] for k in lags), default=0.0)
        else:
            loudest = max(recent)
        if loudest <= FAR_ACTIVE_RMS**2:
            return near, near  # nothing played that could echo here: the microphone as it is
        if gate_db <= 0 or float(np.mean(out**2)) >= loudest * 10 ** (-gate_db / 10):
            return out, out
        self.gated_frames += 1
        return out, np.zeros_like(out)

    def _estimate_delay(self) -> None:
        """The echo's delay, and whether there is an echo path at all (:attr:`echo_free`).

        The delay is the lag of the strongest normalized correlation of microphone and far end.
        A correlated echo less than ``residual_gate_db`` under the far end is an echo path; a
        window of far-end audio with the microphone ``converged_below_db`` under it and no such
        echo is none. The user's speech lowers that loss but never correlates, so talking over
        a reply on a headset does not bring the canceller back.
        """
        # While none is known, a short span (the echo is new in it), but past the longest lag.
        short = max(ECHO_FREE_SPAN_FRAMES, self.options.max_delay_ms // 10 + 10)
        span = short if self.echo_free else DELAY_SPAN_FRAMES
        near = np.concatenate(list(self._delay_near)[-span:])
        far = np.concatenate(list(self._delay_far)[-span:])
        lag, corr = estimate_delay(far, near, self.options.max_delay_ms)
        found = corr >= DELAY_MIN_CORRELATION
        if found:
            self._delay_ms = lag * 1000 / SAMPLE_RATE_HZ
        if self._delay_ms is not None:
            self._count_lost(far, near, np.concatenate(list(self._delay_out)[-span:]), self._delay_ms)
        if found:
            echo_db = 10 * float(
                np.log10(max(float(np.sum(far**2)), 1e-12) / max(float(np.sum(near**2)), 1e-12))
            )
            if echo_db < self.options.residual_gate_db:
                self.echo_free = False
                return
        loss = self.stats().echo_loss_db
        if loss is not None and loss >= self.options.converged_below_db:
            self.echo_free = True

    def _count_lost(self, far: np.ndarray, near: np.ndarray, out: np.ndarray, delay_ms: float) -> None:
        """Count the spans in a row over which the canceller lost the echo (``EchoStats.echo_lost``).

        Lost: under ``converged_erle_db`` removed of an echo that was there (the microphone less
        than ``converged_below_db`` under the far end), while the microphone held the echo alone.
        """
        loss_db, erle_db = levels_db(far, near, out)
        alone = loudness_match(far, near, round(delay_ms * SAMPLE_RATE_HZ / 1000)) >= ECHO_ALONE_MATCH
        options = self.options
        lost = alone and erle_db < options.converged_erle_db and loss_db < options.converged_below_db
        self._lost_spans = self._lost_spans + 1 if lost else 0

    def stats(self) -> EchoStats:
        """ERLE, delay and convergence so far (see :class:`EchoStats`)."""
        erle = loss = None
        converged = False
        if len(self._energy) == self._energy.maxlen:
            e_in, e_out, e_far = (max(sum(e[i] for e in self._energy), 1e-12) for i in range(3))
            erle = 10 * float(np.log10(e_in / e_out))
            loss = 10 * float(np.log10(e_far / e_in))
            converged = self._converged(loss, erle)
            if loss >= self.options.converged_below_db or self.echo_free:
                erle = None  # no echo to speak of (a headset): nothing was there to remove
            converged = converged or self.echo_free
        delay = self._delay_ms - LEAD_MS if self._delay_ms is not None else None
        lost = self._lost_spans >= LOST_SPANS
        return EchoStats(erle, delay, converged, self._far_frames, loss, lost)

    def _converged(self, loss_db: float, erle_db: float) -> bool:
        """Whether the echo left is ``converged_below_db`` under the far end, removed or never there.

        Removed: ``converged_erle_db`` of ERLE; never there: the echo loss alone is that far down.
        """
        below = self.options.converged_below_db
        return loss_db + erle_db >= below and (erle_db >= self.options.converged_erle_db or loss_db >= below)


def _int16(samples: np.ndarray) -> np.ndarray:
    if samples.dtype == np.int16:
        return samples
    return (np.clip(samples, -1, 1) * 32767).astype(np.int16)
