"""Microphone capture with sounddevice (PortAudio); the playback side is :mod:`assistant.stages.playback`.

The callback only copies samples and reads the clock; resampling, VAD and logging happen on
the consumer's thread. A lost device is reported and reopened by
``assistant.stages.devices.DeviceWatch`` (:meth:`Microphone.reopen`). The stages' shared names
(the sample rate, :func:`resample`, the speaker and the sinks) are importable from here too.
"""

from __future__ import annotations

import queue
from typing import Any

import numpy as np

from assistant.config.sections import AudioOptions
from assistant.stages.devices import AudioDeviceError, DeviceLostError
from assistant.stages.playback import AudioSink, FileSink, Speaker
from assistant.stages.streams import SAMPLE_RATE_HZ, DeviceStream, resample

__all__ = [
    "SAMPLE_RATE_HZ",
    "AudioOptions",
    "AudioSink",
    "FileSink",
    "Microphone",
    "Speaker",
    "resample",
]


class Microphone(DeviceStream):
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
        """Start capturing (once; again is a no-op); a stream that cannot start counts as lost."""
        if self.running:
            return
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

    @property
    def input_latency_ns(self) -> int:
        """PortAudio's input latency of the open stream: from the air to the callback."""
        stream = self.stream
        return int(1e9 * float(stream.latency or 0.0)) if stream is not None else 0

    def drain(self) -> None:
        """Drop captured blocks not read yet (e.g. what the mic heard while it was gated)."""
        try:
            while True:
                self.blocks.get_nowait()
        except queue.Empty:  # also when the reader took the last one meanwhile
            pass

    _on_lost = drain
