"""The device stream that capture and playback share: open, lost (died or stalled), reopen.

The PortAudio callbacks only copy samples and read the clock; resampling, VAD and logging
happen on the consumer's thread. A stream that dies (the sound server or the card went
away) marks its device ``lost``; ``assistant.stages.devices.DeviceWatch`` reports it and reopens
the device (:meth:`DeviceStream.reopen`) when it is back.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np

from assistant.config.sections import AudioOptions
from assistant.stages.devices import (
    AudioDeviceError,
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
    """Resample mono float32 audio (speech-grade, no extra dependency), within [-1, 1].

    Downsampling first low-passes with a windowed sinc; then linear interpolation. The
    low-pass rings past full scale next to a loud voice's flat-topped peaks (Piper's voice:
    1.002 seen), so the result is clipped to [-1, 1] like the samples it came from.
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
    out = np.interp(t_in, np.arange(audio.size), audio).astype(np.float32)
    return np.clip(out, -1.0, 1.0, out=out)


class DeviceStream:
    """The stream part shared by the microphone and the speaker: open, lost, reopen.

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
