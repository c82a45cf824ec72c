"""Where reply audio goes: the :class:`AudioSink` protocol, the :class:`Speaker` and the :class:`FileSink`.

The speaker's PortAudio callback only copies samples and reads the clock. A lost output
device is reported and reopened by ``assistant.stages.devices.DeviceWatch``
(:meth:`Speaker.reopen`); while it is lost, ``play`` and ``wait`` raise.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from assistant.config.sections import AudioOptions
from assistant.stages.devices import AudioDeviceError, DeviceLostError
from assistant.stages.streams import SAMPLE_RATE_HZ, DeviceStream, resample


class AudioSink(Protocol):
    """Where reply audio goes: the speaker, or a buffer written to a WAV file.

    Besides playing, a sink tells the turn what the user heard: per turn, when its first
    sample reached the output (``first_audio_t_ns``) and how many samples played
    (``played_samples``, at 16 kHz: what a barge-in keeps of the reply); and whether the
    output device was lost (``lost``, set while it is; ``losses``, how often so far).
    """

    @property
    def first_audio_t_ns(self) -> dict[int, int]:
        """Turn -> ``monotonic_ns`` when its first sample was handed to the output."""
        ...

    @property
    def played_samples(self) -> dict[int, int]:
        """Turn -> samples of it played so far, counted at 16 kHz."""
        ...

    @property
    def losses(self) -> int:
        """How many times the output device was lost so far (0 for a file)."""
        ...

    @property
    def lost(self) -> threading.Event:
        """Set while the output device is lost (until it is reopened); never set for a file."""
        ...

    @property
    def output_latency_ms(self) -> float:
        """The output device's own buffer: how long a sample takes from the sink to the ear."""
        ...

    def play(self, turn_id: int, audio: np.ndarray) -> None:
        """Queue audio behind what is queued."""
        ...

    def queued_ms(self) -> float | None:
        """How much queued audio is still to play; ``None`` for a sink that does not play in real time."""
        ...

    def stop(self) -> None:
        """Drop what is queued, now."""
        ...

    def pause(self) -> None:
        """Hold playback where it is (speech began over the reply); :meth:`resume` plays on."""
        ...

    def resume(self) -> None:
        """Play on from where :meth:`pause` held it."""
        ...

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until everything queued has played."""
        ...


class FileSink:
    """Collects reply audio in memory (file mode); the first sample counts as heard at once."""

    losses = 0  # a file is never lost
    output_latency_ms = 0.0

    def __init__(self) -> None:
        self.segments: list[np.ndarray] = []
        self.first_audio_t_ns: dict[int, int] = {}
        self.played_samples: dict[int, int] = {}
        self.lost = threading.Event()  # never set

    def play(self, turn_id: int, audio: np.ndarray) -> None:
        """Append audio."""
        self.first_audio_t_ns.setdefault(turn_id, time.monotonic_ns())
        self.played_samples[turn_id] = self.played_samples.get(turn_id, 0) + audio.size
        self.segments.append(audio)

    def queued_ms(self) -> None:
        """A file is written as fast as the voice renders: nothing waits to play."""
        return None

    def stop(self) -> None:
        """Nothing plays, so nothing to stop."""

    def pause(self) -> None:
        """Nothing plays, so nothing to hold."""

    def resume(self) -> None:
        """Nothing was held."""

    def wait(self, timeout_s: float | None = None) -> bool:
        """Always done."""
        return True

    def audio(self) -> np.ndarray:
        """Everything played so far."""
        return np.concatenate(self.segments) if self.segments else np.zeros(0, np.float32)


@dataclass
class _Segment:
    turn_id: int
    audio: np.ndarray
    played: int = 0


class Speaker(DeviceStream):
    """An output stream that plays queued segments and can be stopped mid-sentence.

    The callback records, per turn, when the first sample was handed to the device and how
    many samples of each segment were played (so a barge-in knows what the user heard).
    :meth:`pause` holds playback (silence, nothing consumed) until :meth:`resume`.
    With ``far_end`` set (a deque), each block written to the device is appended to it with the
    time its first sample leaves the speaker: the echo canceller's reference. When the device
    is lost, what is queued is dropped and ``play``/``wait`` raise
    :class:`~assistant.stages.devices.DeviceLostError` until it is reopened.
    """

    kind = "output"

    def __init__(self, options: AudioOptions) -> None:
        self._lock = threading.Lock()
        self._segments: deque[_Segment] = deque()
        self.first_audio_t_ns: dict[int, int] = {}
        self.played_samples: dict[int, int] = {}  # per turn, counted at 16 kHz
        self.idle = threading.Event()
        self.idle.set()
        self.paused = False
        self.far_end: deque[tuple[np.ndarray, int]] | None = None  # (block at the device rate, t_ns)
        super().__init__(options, options.output_device)
        self.running = True
        try:
            self._start()
        except AudioDeviceError:
            self.close()
            raise

    def _callback(self, outdata: np.ndarray, frames: int, times: Any, status: Any) -> None:
        now_ns = self._beat(status)
        out = outdata[:, 0]
        filled = 0
        with self._lock:
            while filled < frames and self._segments and not self.paused:
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
        if self.far_end is not None:
            self.far_end.append((out.copy(), now_ns + self._dac_delay_ns(times)))

    def _dac_delay_ns(self, times: Any) -> int:
        """How long until this block's first sample leaves the speaker (PortAudio's timing)."""
        try:
            ahead = float(times.outputBufferDacTime) - float(times.currentTime)
        except (AttributeError, TypeError, ValueError):
            ahead = -1.0
        if not 0.0 < ahead < 1.0:  # not reported by this host API: the stream's latency
            ahead = float(self.stream.latency or 0.0) if self.stream is not None else 0.0
        return int(ahead * 1e9)

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

    def queued_ms(self) -> float:
        """How much queued audio is still to play (held while paused)."""
        with self._lock:
            samples = sum(seg.audio.size - seg.played for seg in self._segments)
        return 1000.0 * samples / self.rate_hz

    def stop(self) -> None:
        """Drop everything queued, mid-sentence included; returns at once."""
        with self._lock:
            self._segments.clear()
            self.paused = False
            self.idle.set()

    def pause(self) -> None:
        """Hold playback where it is: silence until :meth:`resume` (or :meth:`stop`)."""
        with self._lock:
            self.paused = True

    def resume(self) -> None:
        """Play on from where :meth:`pause` held it."""
        with self._lock:
            self.paused = False

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

    @property
    def output_latency_ms(self) -> float:
        """PortAudio's output latency of the open stream (0 while none is open)."""
        stream = self.stream
        return 1000.0 * float(stream.latency or 0.0) if stream is not None else 0.0

    def close(self) -> None:
        """Stop playback and close the stream (idempotent, also after a loss)."""
        self.stop()
        super().close()
