"""Microphone capture and speaker playback with sounddevice (PortAudio); the file sink.

The PortAudio callbacks only copy samples and read the clock; resampling, VAD and logging
happen on the consumer's thread. A stream that dies (the sound server or the card went
away) marks its device ``lost``; ``assistant.stages.devices.DeviceWatch`` reports it and reopens
the device (:meth:`Microphone.reopen`, :meth:`Speaker.reopen`) when it is back.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from assistant.config.sections import AudioOptions
from assistant.stages.devices import (
    AudioDeviceError,
    DeviceLostError,
    abandon_portaudio,
    open_stream,
    portaudio,
    register_stream,
)

logger = logging.getLogger(__name__)

SAMPLE_RATE_HZ = 16000
STARTUP_GRACE_NS = 3_000_000_000  # after a stream's first callback (or an xrun), before stalls count
FIRST_AUDIO_NS = 5_000_000_000  # a started stream whose callback has not run by then is lost
CLOSE_WAIT_S = 1.0  # at close, how long a stream (or the watch holding it) may take


def resample(audio: np.ndarray, from_hz: float, to_hz: float) -> np.ndarray:
    """Resample mono float32 audio (speech-grade, no extra dependency).

    Downsampling first low-passes with a windowed sinc; then linear interpolation.
    """
    if from_hz == to_hz or audio.size == 0:
        return audio.astype(np.float32, copy=False)
    if from_hz > to_hz:  # keep content above the new Nyquist from aliasing into speech
        cutoff = 0.45 * to_hz / from_hz  # cycles per input sample, a bit under Nyquist
        n = np.arange(-32, 33)
        taps = 2 * cutoff * np.sinc(2 * cutoff * n) * np.hamming(n.size)
        audio = np.convolve(audio, taps / taps.sum(), mode="same")
    n_out = int(round(audio.size * to_hz / from_hz))
    t_in = np.arange(n_out) * (from_hz / to_hz)
    return np.interp(t_in, np.arange(audio.size), audio).astype(np.float32)


class _Stream:
    """The stream part shared by :class:`Microphone` and :class:`Speaker`: open, lost, reopen.

    ``lost`` is set when the stream stopped without being asked to (PortAudio's finished
    callback) or when :meth:`check_stall` finds its callback idle for ``stall_ms`` after it
    had run; ``heartbeat_ns`` is the callback's last run, ``first_beat_ns`` its first since
    opening (0: not yet), ``xrun_ns`` its last run that reported an xrun (an underflow or
    overflow: PortAudio restarted the stream) and ``xruns`` how many did.
    """

    kind = ""

    def __init__(self, options: AudioOptions, spec: str | None) -> None:
        self.options = options
        self.spec = spec
        self.lost = threading.Event()
        self.lost_reason = ""
        self.losses = 0  # times the device was lost so far
        self.heartbeat_ns = self.first_beat_ns = self.started_ns = self.xrun_ns = 0
        self.xruns = 0
        self.running = False  # started (and not closed) by its owner
        self._stream_lock = threading.Lock()  # opening/closing; never taken by the callbacks
        self._stream_id = 0  # a finished callback of an older stream is not news
        self.stream: Any = None
        self.name = ""
        self.rate_hz = SAMPLE_RATE_HZ
        self._open()
        register_stream(self)

    def _callback(self, data: np.ndarray, frames: int, _time: Any, status: Any) -> None:
        raise NotImplementedError

    def _open(self) -> None:
        self._stream_id += 1
        stream_id = self._stream_id
        self.heartbeat_ns = self.first_beat_ns = self.started_ns = self.xrun_ns = 0
        self.stream, self.name, self.rate_hz = open_stream(
            self.kind,
            self.spec,
            SAMPLE_RATE_HZ,
            self.options.block_ms,
            self._callback,
            lambda: self._finished(stream_id),
        )

    def _finished(self, stream_id: int) -> None:
        """PortAudio's thread: the stream stopped. News only if nobody asked it to."""
        if stream_id == self._stream_id and self.stream is not None:
            self._mark_lost("the stream stopped (the sound server or the device went away)")

    def _mark_lost(self, reason: str) -> None:
        if not self.lost.is_set():
            self.lost_reason = reason
            self.losses += 1
            self._on_lost()
            self.lost.set()

    def _on_lost(self) -> None:
        """Drop what the old stream holds (subclasses)."""

    def _beat(self, status: Any) -> int:
        """The callback's clock reading (called first thing in each callback with its status)."""
        self.heartbeat_ns = now_ns = time.monotonic_ns()
        if not self.first_beat_ns:
            self.first_beat_ns = now_ns
        if status.output_underflow or status.input_overflow:  # an xrun: PortAudio restarted the stream
            self.xrun_ns = now_ns
            self.xruns += 1
        return now_ns

    def check_stall(self, now_ns: int) -> None:
        """Mark the device lost when its callback stopped running for ``stall_ms`` (watch thread).

        The first :data:`STARTUP_GRACE_NS` after the first callback do not count: a stream on a
        PulseAudio just started fills its buffer, then waits ~1.6 s before running steadily.
        Nor do those after an xrun: a callback that ran late once (a busy machine) makes the
        output underflow, PortAudio restarts the stream and it waits again like a new one
        (1.6-1.9 s measured with PulseAudio's ALSA plugin), which is no loss.
        A stream whose callback has not run :data:`FIRST_AUDIO_NS` after it was started is lost.
        """
        first = self.first_beat_ns
        if not self.running or not self.started_ns:
            return
        if not first:
            if now_ns - self.started_ns > FIRST_AUDIO_NS:
                self._mark_lost(f"no audio {FIRST_AUDIO_NS / 1e9:.0f} s after the stream started")
            return
        since = max(self.heartbeat_ns, first + STARTUP_GRACE_NS, self.xrun_ns + STARTUP_GRACE_NS)
        if now_ns - since > self.options.stall_ms * 1_000_000:
            self._mark_lost(f"no audio for {(now_ns - self.heartbeat_ns) / 1e9:.1f} s (the stream stalled)")

    def is_open(self) -> bool:
        """Whether a stream is open."""
        return self.stream is not None

    def _start(self) -> None:
        self.started_ns = time.monotonic_ns()
        try:
            self.stream.start()
        except portaudio().PortAudioError as e:
            raise AudioDeviceError(f"cannot start {self.kind} device {self.name!r}: {e}") from e

    def release(self) -> None:
        """Close the stream, dead or alive, without reporting it lost (idempotent)."""
        with self._stream_lock:
            self._close_locked()

    def _close_locked(self) -> None:
        stream, self.stream = self.stream, None
        self._stream_id += 1  # its finished callback is not a loss
        if stream is not None:
            try:
                stream.close()  # aborts a running stream; after a loss it is already inactive
            except portaudio().PortAudioError as e:
                logger.debug("closing the %s stream: %s", self.kind, e)

    def reopen(self) -> None:
        """Close the stream if still open, open the configured device again, resume; clears ``lost``.

        Raises:
            AudioDeviceError: It cannot be opened (yet).
        """
        with self._stream_lock:
            self._close_locked()
            self._open()
            try:
                self._on_lost()  # nothing of the old stream's is left over
                if self.running:
                    self._start()
            except AudioDeviceError:
                self._close_locked()
                raise
            self.lost.clear()
            self.lost_reason = ""

    def close(self) -> None:
        """Stop and close the stream (idempotent, also after a loss).

        Never hangs: a stream on a sound server that hangs cannot be closed, and one the
        device watch is stuck with is not ours to close; both are left to the end of the
        process after :data:`CLOSE_WAIT_S`.
        """
        self.running = False
        if not self._stream_lock.acquire(timeout=CLOSE_WAIT_S):
            logger.warning("the %s device does not answer; leaving its stream", self.kind)
            abandon_portaudio()
            return
        try:
            stream, self.stream = self.stream, None
            self._stream_id += 1
        finally:
            self._stream_lock.release()
        if stream is not None:
            closer = threading.Thread(target=stream.close, name=f"close-{self.kind}", daemon=True)
            closer.start()
            closer.join(CLOSE_WAIT_S)
            if closer.is_alive():
                logger.warning("the %s device does not answer; leaving its stream", self.kind)
                abandon_portaudio()


class Microphone(_Stream):
    """A 16 kHz mono input stream; ``read()`` returns ``(samples, t_ns)`` blocks.

    ``t_ns`` is the monotonic time at which the block's last sample was delivered. When the
    device cannot capture at 16 kHz it is opened at its own rate and resampled in ``read()``.
    """

    kind = "input"

    def __init__(self, options: AudioOptions) -> None:
        self.blocks: queue.Queue[tuple[np.ndarray, int]] = queue.Queue(maxsize=2000)
        self.overflows = 0  # blocks dropped because nobody read the queue
        self.device_overflows = 0  # blocks after which PortAudio reported lost input
        super().__init__(options, options.input_device)

    def _callback(self, indata: np.ndarray, frames: int, _time: Any, status: Any) -> None:
        if status.input_overflow:  # PortAudio lost samples before this block (callback late)
            self.device_overflows += 1
        t_ns = self._beat(status)
        try:
            self.blocks.put_nowait((indata[:, 0].copy(), t_ns))
        except queue.Full:
            self.overflows += 1

    def start(self) -> None:
        """Start capturing; a stream that cannot start counts as lost (the watch reopens it)."""
        self.running = True
        try:
            self._start()
        except AudioDeviceError as e:
            self._mark_lost(str(e))

    def read(self, timeout_s: float = 0.1) -> tuple[np.ndarray, int] | None:
        """The next block at 16 kHz, or None after ``timeout_s`` without one.

        Raises:
            DeviceLostError: The device is lost (until it is reopened).
        """
        if self.lost.is_set():
            raise DeviceLostError(f"input device {self.name!r} lost: {self.lost_reason}")
        try:
            block, t_ns = self.blocks.get(timeout=timeout_s)
        except queue.Empty:
            return None
        return resample(block, self.rate_hz, SAMPLE_RATE_HZ), t_ns

    def drain(self) -> None:
        """Drop captured blocks not read yet (e.g. what the mic heard while it was gated)."""
        try:
            while True:
                self.blocks.get_nowait()
        except queue.Empty:  # also when the reader took the last one meanwhile
            pass

    _on_lost = drain


@dataclass
class _Segment:
    turn_id: int
    audio: np.ndarray
    played: int = 0


class Speaker(_Stream):
    """An output stream that plays queued segments and can be stopped mid-sentence.

    The callback records, per turn, when the first sample was handed to the device and how
    many samples of each segment were played (so a barge-in knows what the user heard).
    When the device is lost, what is queued is dropped and ``play``/``wait`` raise
    :class:`~assistant.stages.devices.DeviceLostError` until it is reopened.
    """

    kind = "output"

    def output_latency_ms(self) -> float:
        """The output device's own buffer: what plays after a stop (0 when closed)."""
        return 1000.0 * float(getattr(self.stream, "latency", 0.0) or 0.0)

    def __init__(self, options: AudioOptions) -> None:
        self._lock = threading.Lock()
        self._segments: deque[_Segment] = deque()
        self.first_audio_t_ns: dict[int, int] = {}
        self.played_samples: dict[int, int] = {}  # per turn, counted at 16 kHz
        self.idle = threading.Event()
        self.idle.set()
        super().__init__(options, options.output_device)
        self.running = True
        try:
            self._start()
        except AudioDeviceError:
            self.close()
            raise

    def _callback(self, outdata: np.ndarray, frames: int, _time: Any, status: Any) -> None:
        self._beat(status)
        out = outdata[:, 0]
        filled = 0
        with self._lock:
            while filled < frames and self._segments:
                seg = self._segments[0]
                if seg.turn_id not in self.first_audio_t_ns:
                    self.first_audio_t_ns[seg.turn_id] = time.monotonic_ns()
                n = min(frames - filled, seg.audio.size - seg.played)
                out[filled : filled + n] = seg.audio[seg.played : seg.played + n]
                seg.played += n
                filled += n
                self.played_samples[seg.turn_id] = (
                    self.played_samples.get(seg.turn_id, 0) + n * SAMPLE_RATE_HZ // self.rate_hz
                )
                if seg.played >= seg.audio.size:
                    self._segments.popleft()
            if not self._segments:
                self.idle.set()
        out[filled:] = 0.0

    def _check_lost(self) -> None:
        if self.lost.is_set():
            raise DeviceLostError(f"output device {self.name!r} lost: {self.lost_reason}")

    def play(self, turn_id: int, audio: np.ndarray) -> None:
        """Queue 16 kHz mono audio behind whatever is playing.

        Raises:
            DeviceLostError: The device is lost (until it is reopened).
        """
        self._check_lost()
        audio = resample(audio, SAMPLE_RATE_HZ, self.rate_hz)
        if audio.size == 0:
            return
        with self._lock:
            self._segments.append(_Segment(turn_id, audio))
            self.idle.clear()

    def stop(self) -> None:
        """Drop everything queued, mid-sentence included; returns at once."""
        with self._lock:
            self._segments.clear()
            self.idle.set()

    _on_lost = stop  # sets ``idle`` too, so that a waiter wakes and sees the loss

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the queue has played out; False on timeout.

        Raises:
            DeviceLostError: The device is lost, or was lost while waiting.
        """
        self._check_lost()
        done = self.idle.wait(timeout_s)
        self._check_lost()
        return done

    def close(self) -> None:
        """Stop playback and close the stream (idempotent, also after a loss)."""
        self.stop()
        super().close()


class AudioSink(Protocol):
    """Where reply audio goes: the speaker, or a buffer written to a WAV file.

    ``first_audio_t_ns`` and ``played_samples`` are per turn: when its first sample played and
    how many have played (what the user heard); ``losses`` counts the times the device was
    lost (a change during a reply means its queued audio was dropped).
    """

    first_audio_t_ns: dict[int, int]
    played_samples: dict[int, int]
    losses: int
    lost: threading.Event  # set while the device is lost (replies are then text only)

    def output_latency_ms(self) -> float:
        """The device's own buffer, which still plays after :meth:`stop`."""
        ...

    def play(self, turn_id: int, audio: np.ndarray) -> None:
        """Queue audio behind what is queued."""
        ...

    def stop(self) -> None:
        """Drop what is queued, now."""
        ...

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until everything queued has played."""
        ...


class FileSink:
    """Collects reply audio in memory (file mode); the first sample counts as heard at once."""

    def __init__(self) -> None:
        self.segments: list[np.ndarray] = []
        self.losses = 0  # a file is never lost
        self.lost = threading.Event()
        self.first_audio_t_ns: dict[int, int] = {}
        self.played_samples: dict[int, int] = {}

    def play(self, turn_id: int, audio: np.ndarray) -> None:
        """Append audio."""
        self.first_audio_t_ns.setdefault(turn_id, time.monotonic_ns())
        self.played_samples[turn_id] = self.played_samples.get(turn_id, 0) + audio.size
        self.segments.append(audio)

    def output_latency_ms(self) -> float:
        """A file has no device buffer."""
        return 0.0

    def stop(self) -> None:
        """Nothing plays, so nothing to stop."""

    def wait(self, timeout_s: float | None = None) -> bool:
        """Always done."""
        return True

    def audio(self) -> np.ndarray:
        """Everything played so far."""
        return np.concatenate(self.segments) if self.segments else np.zeros(0, np.float32)
