"""Microphone capture and speaker playback with sounddevice (PortAudio); the file sink.

The PortAudio callbacks only copy samples and read the clock; resampling, VAD and logging
happen on the consumer's thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from assistant.devices import AudioDeviceError, find_device, portaudio
from engines.bounds import bounds

logger = logging.getLogger(__name__)

SAMPLE_RATE_HZ = 16000


@dataclass(frozen=True)
class AudioOptions:
    """Devices by name substring or index (``None``: the system default) and block size."""

    input_device: str | None = None
    output_device: str | None = None
    block_ms: int = field(default=32, metadata=bounds(min=1, max=1000))


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


def _open_stream(kind: str, spec: str | None, block_ms: int, callback: Any) -> tuple[Any, str, int]:
    """Open a mono float32 stream on the chosen device: at 16 kHz, else at the device's rate.

    Returns the stream, the device name and the rate it runs at.
    """
    sd = portaudio()
    device = find_device(spec, kind)
    info = sd.query_devices(device, kind)
    check = sd.check_input_settings if kind == "input" else sd.check_output_settings
    rate_hz = SAMPLE_RATE_HZ
    try:
        check(device, channels=1, samplerate=SAMPLE_RATE_HZ, dtype="float32")
    except sd.PortAudioError:
        rate_hz = int(info["default_samplerate"])
    stream_type = sd.InputStream if kind == "input" else sd.OutputStream
    try:
        stream = stream_type(
            device=device,
            channels=1,
            samplerate=rate_hz,
            dtype="float32",
            blocksize=rate_hz * block_ms // 1000,
            callback=callback,
        )
    except sd.PortAudioError as e:
        raise AudioDeviceError(f"cannot open {kind} device {info['name']!r}: {e}") from e
    return stream, info["name"], rate_hz


class Microphone:
    """A 16 kHz mono input stream; ``read()`` returns ``(samples, t_ns)`` blocks.

    ``t_ns`` is the monotonic time at which the block's last sample was delivered. When the
    device cannot capture at 16 kHz it is opened at its own rate and resampled in ``read()``.
    """

    def __init__(self, options: AudioOptions) -> None:
        self.blocks: queue.Queue[tuple[np.ndarray, int]] = queue.Queue(maxsize=2000)
        self.overflows = 0  # blocks dropped because nobody read the queue
        self.device_overflows = 0  # blocks after which PortAudio reported lost input
        self.stream, self.name, self.rate_hz = _open_stream(
            "input", options.input_device, options.block_ms, self._callback
        )

    def _callback(self, indata: np.ndarray, frames: int, _time: Any, status: Any) -> None:
        if status.input_overflow:  # PortAudio lost samples before this block (callback late)
            self.device_overflows += 1
        try:
            self.blocks.put_nowait((indata[:, 0].copy(), time.monotonic_ns()))
        except queue.Full:
            self.overflows += 1

    def start(self) -> None:
        """Start capturing."""
        self.stream.start()

    def read(self, timeout_s: float = 0.1) -> tuple[np.ndarray, int] | None:
        """The next block at 16 kHz, or None after ``timeout_s`` without one."""
        try:
            block, t_ns = self.blocks.get(timeout=timeout_s)
        except queue.Empty:
            return None
        return resample(block, self.rate_hz, SAMPLE_RATE_HZ), t_ns

    def drain(self) -> None:
        """Drop captured blocks not read yet (e.g. what the mic heard while it was gated)."""
        while not self.blocks.empty():
            self.blocks.get_nowait()

    def close(self) -> None:
        """Stop and close the stream."""
        self.stream.stop()
        self.stream.close()


@dataclass
class _Segment:
    turn_id: int
    audio: np.ndarray
    played: int = 0


class Speaker:
    """An output stream that plays queued segments and can be stopped mid-sentence.

    The callback records, per turn, when the first sample was handed to the device and how
    many samples of each segment were played (so a barge-in knows what the user heard).
    """

    def __init__(self, options: AudioOptions) -> None:
        self._lock = threading.Lock()
        self._segments: deque[_Segment] = deque()
        self.first_audio_t_ns: dict[int, int] = {}
        self.played_samples: dict[int, int] = {}  # per turn, counted at 16 kHz
        self.idle = threading.Event()
        self.idle.set()
        self.stream, self.name, self.rate_hz = _open_stream(
            "output", options.output_device, options.block_ms, self._callback
        )
        self.stream.start()

    def _callback(self, outdata: np.ndarray, frames: int, _time: Any, status: Any) -> None:
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

    def play(self, turn_id: int, audio: np.ndarray) -> None:
        """Queue 16 kHz mono audio behind whatever is playing."""
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

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the queue has played out; False on timeout."""
        return self.idle.wait(timeout_s)

    def close(self) -> None:
        """Stop playback and close the stream."""
        self.stop()
        self.stream.stop()
        self.stream.close()


class AudioSink(Protocol):
    """Where reply audio goes: the speaker, or a buffer written to a WAV file."""

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
        self.first_audio_t_ns: dict[int, int] = {}
        self.played_samples: dict[int, int] = {}

    def play(self, turn_id: int, audio: np.ndarray) -> None:
        """Append audio."""
        self.first_audio_t_ns.setdefault(turn_id, time.monotonic_ns())
        self.played_samples[turn_id] = self.played_samples.get(turn_id, 0) + audio.size
        self.segments.append(audio)

    def stop(self) -> None:
        """Nothing plays, so nothing to stop."""

    def wait(self, timeout_s: float | None = None) -> bool:
        """Always done."""
        return True

    def audio(self) -> np.ndarray:
        """Everything played so far."""
        return np.concatenate(self.segments) if self.segments else np.zeros(0, np.float32)
