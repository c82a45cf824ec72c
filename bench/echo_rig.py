"""The speaker-to-microphone echo path of ``scripts/virtual-audio.sh echo on``, for tests and benches.

``private_audio(prefix)`` starts a PulseAudio of its own for a ``with`` block and gives its
environment; ``echo_path(env, delay_ms=60, gain_db=-13)`` adds the path for a ``with`` block;
``play_and_record`` plays a signal on ``spk`` and records what was played (``spk.monitor``, the
echo canceller's far end) and what the microphone heard (``virtmic``, the near end) on one
time base;
``estimate_echo`` measures the path's delay and gain from such a pair.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "scripts" / "virtual-audio.sh")
SAMPLE_RATE_HZ = 16000


@contextmanager
def private_audio(prefix: str) -> Iterator[dict[str, str]]:
    """``scripts/virtual-audio.sh start`` in a fresh runtime folder; yields its environment, then stops it."""
    runtime = tempfile.mkdtemp(prefix=prefix)
    base = {**os.environ, "VIRTUAL_AUDIO_RUNTIME": runtime}
    started = subprocess.run([SCRIPT, "start"], env=base, capture_output=True, text=True, check=True)
    env = dict(line.removeprefix("export ").split("=", 1) for line in started.stdout.split() if "=" in line)
    try:
        yield {k: v.strip("'\"") for k, v in env.items()} | {"VIRTUAL_AUDIO_RUNTIME": runtime}
    finally:
        subprocess.run([SCRIPT, "stop"], env=base, capture_output=True)


@contextmanager
def echo_path(
    env: dict[str, str], delay_ms: int = 60, gain_db: float = -13, reflections: int = 2
) -> Iterator[None]:
    """The echo path on the private PulseAudio of ``env`` (the ``pulse`` fixture) for a block."""
    full = {**os.environ, **env}
    args = [SCRIPT, "echo", "on", str(delay_ms), str(gain_db), str(reflections)]
    subprocess.run(args, env=full, check=True, capture_output=True)
    try:
        yield
    finally:
        subprocess.run([SCRIPT, "echo", "off"], env=full, check=True, capture_output=True)


class _Recorder:
    """``parec`` of one source, read by a thread that notes when each chunk arrives."""

    def __init__(self, env: dict[str, str], source: str) -> None:
        cmd = [
            "parec",
            "-d",
            source,
            "--raw",
            "--format=s16le",
            "--rate=16000",
            "--channels=1",
            "--latency-msec=10",
        ]
        self.proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=subprocess.PIPE)
        self.chunks: list[bytes] = []
        self.starts_ns: list[int] = []  # per chunk: arrival time minus the samples before its end
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        total = 0
        while chunk := self.proc.stdout.read1(640):  # type: ignore[attr-defined]
            now = time.monotonic_ns()
            self.chunks.append(chunk)
            total += len(chunk) // 2
            self.starts_ns.append(now - total * 1_000_000_000 // SAMPLE_RATE_HZ)

    def stop(self) -> tuple[np.ndarray, int]:
        """The samples and the time of the first one (the earliest estimate: least queueing)."""
        self.proc.terminate()
        self.proc.wait()
        self.thread.join()
        audio = np.frombuffer(b"".join(self.chunks), np.int16).astype(np.float32) / 32768
        return audio, min(self.starts_ns)


def play_and_record(
    env: dict[str, str], audio: np.ndarray, lead_s: float = 0.5, tail_s: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """Play ``audio`` on ``spk``; return (what was played, what ``virtmic`` heard), aligned in time.

    Both recordings run at once and are cut to a common start from their arrival times, so a
    lag between them is the echo path's delay (to within a few ms of transport jitter).
    """
    far_rec, near_rec = _Recorder(env, "spk.monitor"), _Recorder(env, "virtmic")
    time.sleep(lead_s)
    pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16).tobytes()
    play = ["pacat", "-d", "spk", "--raw", "--format=s16le", "--rate=16000", "--channels=1"]
    subprocess.run(play, input=pcm, env={**os.environ, **env}, check=True)
    time.sleep(tail_s)
    far, far_t0 = far_rec.stop()
    near, near_t0 = near_rec.stop()
    skip = round((near_t0 - far_t0) * SAMPLE_RATE_HZ / 1e9)  # samples the far end started earlier
    far = far[skip:] if skip > 0 else np.concatenate([np.zeros(-skip, np.float32), far])
    n = min(len(far), len(near))
    return far[:n], near[:n]


@dataclass(frozen=True)
class EchoEstimate:
    """The echo path as measured: the direct tap's delay and gain, and the whole echo's level."""

    delay_ms: float
    gain_db: float  # of the direct (strongest) tap
    level_db: float  # energy of the near end relative to the far end (all taps)


def estimate_echo(far: np.ndarray, near: np.ndarray, max_delay_ms: float = 400) -> EchoEstimate:
    """Cross-correlate ``near`` against ``far``: the strongest lag and its least-squares gain."""
    n = len(far)
    size = 1 << (2 * n - 1).bit_length()
    corr = np.fft.irfft(np.fft.rfft(near, size) * np.conj(np.fft.rfft(far, size)), size)
    max_lag = int(max_delay_ms * SAMPLE_RATE_HZ / 1000)
    lag = int(np.argmax(corr[: max_lag + 1]))
    shifted = far[: n - lag]
    gain = float(np.dot(near[lag:], shifted) / np.dot(shifted, shifted))
    level = float(np.sum(near**2) / np.sum(far**2))
    return EchoEstimate(lag * 1000 / SAMPLE_RATE_HZ, 20 * np.log10(abs(gain)), 10 * np.log10(level))
